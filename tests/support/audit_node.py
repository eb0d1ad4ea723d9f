"""A GPU node as host.audit sees it in the tests: its pods' cgroup lines in every layout, a fixture /proc tree, and
the stack file and arguments that point the audit at them; shared by tests/test_audit*.py."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.stacks import CLUSTER

POD = "0d3d1c8a-6b0e-4c3c-9a4c-1e2f3a4b5c6d"
POD_ = POD.replace("-", "_")
CID = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
EXPOSED = "GPU-aaaaaaaa-1111-4222-8333-444455556666"
HIDDEN = "GPU-bbbbbbbb-1111-4222-8333-444455556666"

CGROUP_LAYOUTS = {
    "v1-cgroupfs-containerd": (
        f"12:memory:/kubepods/burstable/pod{POD}/{CID}\n"
        f"11:devices:/kubepods/burstable/pod{POD}/{CID}\n"
        f"1:name=systemd:/kubepods/burstable/pod{POD}/{CID}\n"
    ),
    "v1-systemd-containerd": (
        f"12:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_}.slice/cri-containerd-{CID}.scope\n"
        "0::/\n"
    ),
    "v1-systemd-crio": f"4:pids:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_}.slice/crio-{CID}.scope\n",
    "v2-systemd-containerd": f"0::/kubepods.slice/kubepods-pod{POD_}.slice/cri-containerd-{CID}.scope\n",
    "v2-systemd-crio": f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_}.slice/crio-{CID}.scope\n",
    "v2-cgroupfs-containerd": f"0::/kubepods/pod{POD}/{CID}\n",
    "v2-cgroupfs-crio": f"0::/kubepods/besteffort/pod{POD}/crio-{CID}\n",
    "v2-seen-from-a-pod-cgroup-namespace": f"0::/../../kubepods-besteffort-pod{POD_}.slice/cri-containerd-{CID}.scope\n",
}
HOST_CGROUPS = {
    "v2-user-session": "0::/user.slice/user-1000.slice/session-3.scope\n",
    "v2-docker-outside-kubernetes": f"0::/system.slice/docker-{CID}.scope\n",
    "v1-host-service": "12:memory:/system.slice/partner-trainer.service\n1:name=systemd:/system.slice/partner-trainer.service\n",
}


def proc_tree(root: Path, cgroups: dict[int, str | bytes]) -> Path:
    """A host's /proc: self/, init (pid 1, as every live proc tree has) and the given processes."""
    (root / "proc" / "self").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "1").mkdir(exist_ok=True)
    (root / "proc" / "1" / "cgroup").write_text(HOST_CGROUPS[next(iter(HOST_CGROUPS))])
    for pid, text in cgroups.items():
        (root / "proc" / str(pid)).mkdir(parents=True)
        cgroup = root / "proc" / str(pid) / "cgroup"
        cgroup.write_bytes(text) if isinstance(text, bytes) else cgroup.write_text(text)
    return root / "proc"


def stack_file(root: Path) -> Path:
    path = root / "Pulumi.t.yaml"
    node = {"name": "gpu-node-01", "exposedGpus": [EXPOSED], "hiddenGpus": [HIDDEN]}
    path.write_text(yaml.safe_dump({"config": {**CLUSTER, "hidden-gpu:nodes": [node]}}))
    return path


def run_args(root: Path) -> list[str]:
    return [
        "--stack-file",
        str(stack_file(root)),
        "--node",
        "gpu-node-01",
        "--proc-root",
        str(root / "proc"),
        "--log-root",
        str(root / "log"),
        "--pod-resources-socket",
        str(root / "kubelet.sock"),
    ]
