"""host.audit: NVML processes mapped to pods through fixture /proc trees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from host import audit
from tests.support.fake_nvml import FakeGpu, fake_nvml

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


@pytest.mark.parametrize("layout", CGROUP_LAYOUTS, ids=list(CGROUP_LAYOUTS))
def test_pod_and_container_from_cgroup(layout: str) -> None:
    assert audit.owner_from_cgroup(CGROUP_LAYOUTS[layout]) == audit.Owner(POD, CID)


@pytest.mark.parametrize("layout", HOST_CGROUPS, ids=list(HOST_CGROUPS))
def test_host_processes_have_no_pod(layout: str) -> None:
    assert audit.owner_from_cgroup(HOST_CGROUPS[layout]) == audit.Owner(None, None)


def proc_tree(root: Path, cgroups: dict[int, str]) -> Path:
    for pid, text in cgroups.items():
        (root / "proc" / str(pid)).mkdir(parents=True)
        (root / "proc" / str(pid) / "cgroup").write_text(text)
    return root / "proc"


def stack_file(root: Path) -> Path:
    path = root / "Pulumi.t.yaml"
    node = {"name": "gpu-node-01", "exposedGpus": [EXPOSED], "hiddenGpus": [HIDDEN]}
    path.write_text(yaml.safe_dump({"config": {"hidden-gpu:nodes": [node]}}))
    return path


def run(root: Path, gpus: list[FakeGpu], capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    args = ["--stack-file", str(stack_file(root)), "--node", "gpu-node-01", "--proc-root", str(root / "proc"), *extra]
    status = audit.main(args, nvml=fake_nvml(gpus))
    return status, capsys.readouterr().out


def test_pod_on_hidden_gpu_is_a_violation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc_tree(
        tmp_path,
        {
            100: CGROUP_LAYOUTS["v2-systemd-containerd"],
            200: HOST_CGROUPS["v2-user-session"],
            300: CGROUP_LAYOUTS["v1-cgroupfs-containerd"],
            400: HOST_CGROUPS["v1-host-service"],
        },
    )
    gpus = [
        FakeGpu(EXPOSED, compute=[(100, 2**30), (200, 2**20)]),
        FakeGpu(HIDDEN, compute=[(400, 5 * 2**30)], graphics=[(300, None)]),
    ]
    status, out = run(tmp_path, gpus, capsys, "--json")
    report = json.loads(out)
    assert status == 1
    assert report["node"] == "gpu-node-01"
    assert report["gpus"][0] == {
        "uuid": EXPOSED,
        "index": 0,
        "exposed": True,
        "processes": [
            {"pid": 100, "usedGpuMemoryBytes": 2**30, "podUid": POD, "containerId": CID},
            {"pid": 200, "usedGpuMemoryBytes": 2**20, "podUid": None, "containerId": None},
        ],
    }
    assert report["gpus"][1]["exposed"] is False
    assert [v["pid"] for v in report["violations"]] == [300]
    assert report["violations"][0]["podUid"] == POD and report["violations"][0]["uuid"] == HIDDEN
    assert [(w["pid"], w["message"]) for w in report["warnings"]] == [
        (200, "a process outside Kubernetes uses an exposed GPU")
    ]


def test_clean_node_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc_tree(tmp_path, {100: CGROUP_LAYOUTS["v2-cgroupfs-crio"], 400: HOST_CGROUPS["v1-host-service"]})
    gpus = [FakeGpu(EXPOSED, compute=[(100, 1)]), FakeGpu(HIDDEN, compute=[(400, 1)])]
    status, out = run(tmp_path, gpus, capsys)
    assert status == 0
    assert f"pid 100: pod {POD} container {CID[:12]}" in out and "pid 400: host (not in a pod)" in out
    assert out.strip().endswith("result: 0 violation(s), 0 warning(s)")


def test_gpu_missing_from_the_stack_counts_as_hidden(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc_tree(tmp_path, {100: CGROUP_LAYOUTS["v2-cgroupfs-containerd"]})
    stranger = FakeGpu("GPU-cccccccc-1111-4222-8333-444455556666", compute=[(100, 1)])
    status, _ = run(tmp_path, [FakeGpu(EXPOSED), FakeGpu(HIDDEN), stranger], capsys)
    assert status == 1


def test_process_that_exits_mid_scan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc_tree(tmp_path, {})
    (tmp_path / "proc").mkdir(exist_ok=True)
    status, out = run(tmp_path, [FakeGpu(EXPOSED), FakeGpu(HIDDEN, compute=[(4242, 1)])], capsys, "--json")
    report = json.loads(out)
    assert status == 0
    assert report["gpus"][1]["processes"] == []
    assert report["warnings"][0]["pid"] == 4242 and report["warnings"][0]["message"] == "process exited during the scan"


def test_unreadable_cgroup_is_a_warning_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "proc" / "77" / "cgroup").mkdir(parents=True)  # reading it fails with an OSError
    status, out = run(tmp_path, [FakeGpu(EXPOSED), FakeGpu(HIDDEN, compute=[(77, 1)])], capsys, "--json")
    report = json.loads(out)
    assert status == 0
    assert report["gpus"][1]["processes"][0]["podUid"] is None
    assert "cannot read its cgroup" in report["warnings"][0]["message"]


def test_no_driver(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--stack-file", str(stack_file(tmp_path)), "--node", "gpu-node-01"]
    assert audit.main(args, nvml=fake_nvml([], init_error="LibraryNotFound")) == 3
    assert "no NVIDIA driver here" in capsys.readouterr().err


def test_gpu_exposed_by_its_mig_devices_counts_as_exposed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parent = "GPU-dddddddd-1111-4222-8333-444455556666"
    mig = "MIG-eeeeeeee-1111-4222-8333-444455556666"
    proc_tree(tmp_path, {100: CGROUP_LAYOUTS["v2-systemd-containerd"]})
    stack = tmp_path / "Pulumi.t.yaml"
    node = {
        "name": "gpu-node-01",
        "exposedGpus": [mig],
        "hiddenGpus": [HIDDEN],
        "migStrategy": "mixed",
        "migDevices": {parent: [mig]},
    }
    stack.write_text(yaml.safe_dump({"config": {"hidden-gpu:nodes": [node]}}))
    gpus = [FakeGpu(parent, mig_uuids=[mig], compute=[(100, 1)]), FakeGpu(HIDDEN)]
    args = ["--stack-file", str(stack), "--node", "gpu-node-01", "--proc-root", str(tmp_path / "proc"), "--json"]
    assert audit.main(args, nvml=fake_nvml(gpus)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"][0]["exposed"] is True and report["violations"] == []
