"""The node tier's containerd: its configuration (CRI with runtimes `runc` and `nvidia`, the node's CDI spec
directories, a CNI stub for a network the tier does not have) and the images it imports."""

from __future__ import annotations

import json
from pathlib import Path

from e2e import images

CNI_STUB = """#!/bin/sh
# hidden-gpu's CNI stub for the node tier, installed as the network's plugin and as `loopback` (containerd adds a
# loopback network of its own): reports an address, 127.0.0.1 for lo and a TEST-NET-1 one (RFC 5737) for the
# pod's interface, and configures nothing: the pod's network namespace keeps only lo, down. DEL, CHECK and the
# rest have nothing to undo.
cat >/dev/null
if [ "$CNI_IFNAME" = lo ]; then address=127.0.0.1/8
else address="192.0.2.$(( $(od -An -N1 -tu1 /dev/urandom) % 250 + 2 ))/24"; fi
case "$CNI_COMMAND" in
ADD) printf '{"cniVersion":"1.0.0","interfaces":[{"name":"%s","sandbox":"%s"}],' "$CNI_IFNAME" "$CNI_NETNS"
     printf '"ips":[{"address":"%s","interface":0}]}' "$address" ;;
VERSION) printf '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}' ;;
esac
"""


def socket_of(root: Path) -> Path:
    """Where the containerd of a node under `root` serves CRI (its ttrpc socket beside it)."""
    return root / "containerd/containerd.sock"


def write_cni(directory: Path) -> None:
    """The stub as the network's plugin and as `loopback`, and the network list naming it, under `directory`."""
    (directory / "bin").mkdir(parents=True)
    (directory / "conf").mkdir()
    stub = directory / "bin/hidden-gpu-cni-stub"
    stub.write_text(CNI_STUB)
    stub.chmod(0o755)
    (directory / "bin/loopback").symlink_to(stub.name)
    conf = {"cniVersion": "1.0.0", "name": "hidden-gpu-stub", "plugins": [{"type": stub.name}]}
    (directory / "conf/10-hidden-gpu-stub.conflist").write_text(json.dumps(conf))


def containerd_config(root: Path, bin_dir: Path, snapshotter: str, cdi: list[Path]) -> str:
    """containerd's config.toml for a node under `root`: its state there, the CRI plugin reading the CDI specs in
    `cdi`, runtimes `runc` (the default) and `nvidia` (root/toolkit/nvidia-runtime, NVIDIA's runtime before runc)."""
    c = root / "containerd"
    runtime = "plugins.'io.containerd.cri.v1.runtime'"

    def runc_runtime(name: str, binary: Path) -> str:
        return (
            f"[{runtime}.containerd.runtimes.{name}]\n"
            'runtime_type = "io.containerd.runc.v2"\n'
            f"[{runtime}.containerd.runtimes.{name}.options]\n"
            f'BinaryName = "{binary}"\n'
            "SystemdCgroup = false\n"
        )

    return (
        "version = 3\n"
        f'root = "{c}/root"\nstate = "{c}/state"\n'
        f'[grpc]\naddress = "{socket_of(root)}"\n'
        f'[ttrpc]\naddress = "{socket_of(root)}.ttrpc"\n'
        f"[plugins.'io.containerd.internal.v1.opt']\npath = \"{c}/opt\"\n"
        "[plugins.'io.containerd.nri.v1.nri']\ndisable = true\n"
        "[plugins.'io.containerd.grpc.v1.cri']\n"
        'stream_server_address = "127.0.0.1"\nstream_server_port = "0"\n'
        "[plugins.'io.containerd.cri.v1.images']\n"
        f'snapshotter = "{snapshotter}"\n'
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]\n"
        f'sandbox = "{images.PAUSE.name}"\n'
        f"[{runtime}]\n"
        f"cdi_spec_dirs = {json.dumps([str(d) for d in cdi])}\n"
        # Root here (and on the GPU machine) lacks CAP_SYS_RESOURCE: without this a sandbox fails
        # "failed to update /proc/self/oom_score_adj" (shared/notes/real-node.md).
        "restrict_oom_score_adj = true\n"
        f"[{runtime}.cni]\n"
        f'bin_dirs = ["{root / "cni/bin"}"]\nconf_dir = "{root / "cni/conf"}"\n'
        f"[{runtime}.containerd]\n"
        'default_runtime_name = "runc"\n'
        + runc_runtime("runc", bin_dir.resolve() / "runc")
        + runc_runtime("nvidia", root / "toolkit/nvidia-runtime")
    )


def tier_images(bin_dir: Path) -> list[tuple[images.Image, dict[str, Path]]]:
    """The node tier's images and their files: pause, probe, the stand-ins of NVIDIA's plugin, GFD, dcgm-exporter
    and DRA kubelet plugin, and of the GPU Operator's plugin and validator."""
    return [
        (images.PAUSE, {"pause": bin_dir / "pause"}),
        (images.PROBE, {"probe": bin_dir / "probe"}),
        (
            images.PLUGIN,
            {
                **images.host_programs("/bin/sh", "/bin/sleep"),
                "hidden-gpu-test-plugin": bin_dir / "hidden-gpu-test-plugin",
            },
        ),
        (images.GFD, {"usr/bin/gpu-feature-discovery": bin_dir / "hidden-gpu-test-gfd"}),
        (images.DCGM_EXPORTER, {"hidden-gpu-test-dcgm-exporter": bin_dir / "hidden-gpu-test-dcgm-exporter"}),
        (images.DRA_PLUGIN, {"usr/bin/gpu-kubelet-plugin": bin_dir / "hidden-gpu-test-dra-plugin"}),
        (
            images.OPERATOR_PLUGIN,
            {
                **images.host_programs("/bin/bash", "/usr/bin/cat"),
                "usr/bin/nvidia-device-plugin": bin_dir / "hidden-gpu-test-plugin",
            },
        ),
        (images.OPERATOR_VALIDATOR, images.host_programs("/bin/sh")),
    ]
