"""What a GPU host run does on the host, whichever run it is (lab/gpu_node_run.py, lab/gpu_dra_run.py): the
carry unpacked, the host's facts and NVML libraries, the pod image, the CDI spec, the render with the host's UUID
in the placeholder's place, the packages the device lacks unpacked."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e import images
from e2e.build import LINKS
from e2e.images import Image
from lab.gpu_pack import NODESET_FILE

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PLUGIN_XZ = "nvidia-device-plugin-v0.20.0.xz"
HOLD = "hidden-gpu-cuda-hold"  # lab/cuda_hold.c, built by `prepare`
# The packages the device lacks, unpacked from their wheels here and carried as one xz archive (a third of the wheels).
SITE = "site.tar.xz"
PLUGIN_SHA256 = "58737ebefd1b8fd755292b8b4816d6cff208f6267471c2ce08bd624ab78054d1"
RENDER_FILE = "render.json"
NODE = "gpu-node-01"
TENANT = "ml-team"
GPU = "nvidia.com/gpu"
PLUGIN_NAMESPACE = "hidden-gpu-system"
PLACEHOLDER = "GPU-00000000-0000-4000-8000-000000000000"
# What the stack exposes instead when it hides the host's GPU (the dra-hidden render): a UUID no GPU has.
ELSEWHERE = "GPU-11111111-1111-4111-8111-111111111111"
KUBERNETES_PROGRAMS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
UUID = re.compile(r"\(UUID: ((?:GPU|MIG)-[0-9a-f-]+)\)")
REQUEST_DIR = "/var/run/nvidia-container-devices"
WAIT_S = 90.0
# The pod image's one program, dash: what decides the container's GPUs, then nvidia-smi -L, one fact a line.
SCRIPT = """
echo "env NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES-<unset>}"
for f in /dev/nvidia*; do [ -e "$f" ] && echo "dev ${f#/dev/}"; done
for f in /var/run/nvidia-container-devices/*; do [ -e "$f" ] && echo "request ${f##*/}"; done
for f in /run/hidden-gpu-test/gpus/*; do [ -e "$f" ] && echo "cdi-file ${f##*/}"; done
for f in /lib64/libnvidia-ml.so* /usr/local/nvidia/lib64/libnvidia-ml.so*; do [ -e "$f" ] && echo "nvml $f"; done
out=$(/usr/bin/nvidia-smi -L 2>&1); rc=$?
echo "$out" | while IFS= read -r line; do echo "smi $line"; done
echo "smi-rc $rc"
echo done
[ "$1" = hold ] && exec /pause
[ "$1" = cuda ] && exec /hold
exit 0
"""


def stack(strategy: str) -> dict[str, Any]:
    """One node exposing its one GPU (the placeholder, replaced at run time); the plugin's strategy as given."""
    plugin: dict[str, Any] = {"image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0", "deviceListStrategy": strategy}
    if strategy == "volume-mounts":
        plugin["volumeMountsAcceptedBy"] = "nodeConfig"  # the node's toolkit config accepts them (HARDENED)
    return {
        "kubernetes:context": "admin@e2e",
        "pulumi:disable-default-providers": ["kubernetes"],
        "hidden-gpu:nodes": [{"name": NODE, "exposedGpus": [PLACEHOLDER], "hiddenGpus": []}],
        "hidden-gpu:devicePlugin": plugin,
    }


# --- run (the GPU host) ------------------------------------------------------------------------------------------


def sh(*args: str | Path, check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=check, timeout=timeout)


def unpack_nodeset(carry: Path, into: Path) -> dict[str, Any]:
    """The node set into `into`, each binary checked; the multi-call binary under each program's name."""
    into.mkdir(parents=True)
    with lzma.open(carry / NODESET_FILE) as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
        tar.extractall(into, filter="tar")
    for name in KUBERNETES_PROGRAMS:
        (into / name).symlink_to("hidden-gpu-host")
    packed: dict[str, Any] = json.loads((carry / "nodeset.json").read_text())
    for name, digest in packed["sha256"].items():
        if hashlib.sha256((into / name).read_bytes()).hexdigest() != digest:
            raise RuntimeError(f"{name}: not the binary packed")
    return packed


def unpack(carry: Path, into: Path, rehearse: bool) -> dict[str, Any]:
    """The node set and NVIDIA's plugin into `into`."""
    packed = unpack_nodeset(carry, into)
    if rehearse:
        for name in ("probe", "hidden-gpu-test-plugin"):
            shutil.copy(LINKS / name, into / name)
    else:
        plugin = lzma.decompress((carry / PLUGIN_XZ).read_bytes())
        if hashlib.sha256(plugin).hexdigest() != PLUGIN_SHA256:
            raise RuntimeError(f"{PLUGIN_XZ}: not the binary ../shared/bin/README.md names")
        (into / "nvidia-device-plugin").write_bytes(plugin)
        (into / "nvidia-device-plugin").chmod(0o755)
    return packed


def host_facts(rehearse: bool) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "kernel": platform.release(),
        "cgroup": "v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "v1",
        "pid1": Path("/proc/1/comm").read_text().strip(),
        "os": next((line.split("=", 1)[1].strip('"') for line in Path("/etc/os-release").read_text().splitlines()
                    if line.startswith("PRETTY_NAME=")), ""),
        "cpus": os.cpu_count(),
    }  # fmt: skip
    if not rehearse:
        query = sh("nvidia-smi", "--query-gpu=index,name,uuid,driver_version", "--format=csv,noheader", check=True)
        rows = [[part.strip() for part in line.split(",")] for line in query.stdout.strip().splitlines()]
        facts["gpus"] = [{"index": int(r[0]), "name": r[1], "uuid": r[2]} for r in rows]
        facts["driver"] = rows[0][3]
    return facts


def libraries(*programs: Path) -> dict[str, Path]:
    """The shared libraries `ldd` names for the programs, at their paths (the image's layout = the host's)."""
    found: dict[str, Path] = {}
    for program in programs:
        for line in sh("ldd", program, check=True).stdout.splitlines():
            match = re.search(r"(/\S+) \(0x", line)
            if match:
                found[match.group(1).lstrip("/")] = Path(match.group(1))
    return found


def nvml(spec_dir: Path) -> tuple[str, dict[str, Path]]:
    """Where the CDI spec mounts NVML in a container (the pod and plugin images' LD_LIBRARY_PATH: an image without
    ldconfig finds NVML only so, ../shared/notes/real-node.md), and the libraries NVML itself needs (libm, libdl,
    libpthread, librt: dlopen fails, and NVML reports ERROR_LIBRARY_NOT_FOUND, without them in the image)."""
    for spec in spec_dir.glob("*.yaml"):
        match = re.search(
            r"hostPath: (/\S+/libnvidia-ml\.so\.\d\S*)\n\s+containerPath: (/\S+)/libnvidia-ml", spec.read_text()
        )
        if match:
            return match.group(2), libraries(Path(match.group(1)))
    return "", {}


def pod_image(bin_dir: Path, work: Path, spec_dir: Path, hold: Path | None) -> tuple[Image, dict[str, Path]]:
    """The pod image: dash running SCRIPT, nvidia-smi, pause and (given) the CUDA holder, with their libraries."""
    work.mkdir(parents=True, exist_ok=True)
    # For the toolkit's ldcache hook, which runs ldconfig over the container's /etc.
    (work / "ld.so.conf").write_text("")
    (work / "script.sh").write_text(SCRIPT)
    dash = Path(shutil.which("dash") or "/bin/sh").resolve()
    smi = shutil.which("nvidia-smi")
    library_path, nvml_needs = nvml(spec_dir)
    env = {"NVIDIA_VISIBLE_DEVICES": "all", **({"LD_LIBRARY_PATH": library_path} if library_path else {})}
    held = {"hold": hold} if hold else {}
    pod_files = {"bin/sh": dash, "script.sh": work / "script.sh", "pause": bin_dir / "pause",
                 "etc/ld.so.conf": work / "ld.so.conf", **held, **libraries(dash, *held.values()),
                 **nvml_needs}  # fmt: skip
    if smi:
        pod_files |= {"usr/bin/nvidia-smi": Path(smi), **libraries(Path(smi))}
    return Image("hidden-gpu.test/nvidia-smi:1", ("/bin/sh", "/script.sh"), env), pod_files


def make_images(
    bin_dir: Path, work: Path, rehearse: bool, spec_dir: Path, hold: Path
) -> list[tuple[Image, dict[str, Path]]]:
    """pause, the pod image and the plugin image (NVIDIA's binary, or the stand-in)."""
    pod, pod_files = pod_image(bin_dir, work, spec_dir, hold)
    ld_conf = work / "ld.so.conf"
    library_path, nvml_needs = nvml(spec_dir)
    # The rendered plugin's wait runs sh and sleep from the plugin's image (NVIDIA's has busybox's: Dockerfile:46-60).
    shell = {"bin/sh": Path(shutil.which("dash") or "/bin/sh").resolve(), "bin/sleep": Path("/bin/sleep").resolve()}
    shell |= libraries(*shell.values())
    if rehearse:
        plugin_image = images.PLUGIN
        plugin_files = {"hidden-gpu-test-plugin": bin_dir / "hidden-gpu-test-plugin", **shell}
    else:
        binary = bin_dir / "nvidia-device-plugin"
        # NVIDIA's image's variables (deployments/container/Dockerfile:62-64 of k8s-device-plugin v0.20.0).
        plugin_env = {"PATH": "/bin", "NVIDIA_DISABLE_REQUIRE": "true", "NVIDIA_VISIBLE_DEVICES": "all",
                      "NVIDIA_DRIVER_CAPABILITIES": "compute,utility", "LD_LIBRARY_PATH": library_path}  # fmt: skip
        plugin_image = Image("hidden-gpu.test/nvidia-device-plugin:v0.20.0", ("/nvidia-device-plugin",), plugin_env)
        plugin_files = {"nvidia-device-plugin": binary, "etc/ld.so.conf": ld_conf, **libraries(binary), **nvml_needs}
        plugin_files |= shell
    return [(images.PAUSE, {"pause": bin_dir / "pause"}), (pod, pod_files), (plugin_image, plugin_files)]


def cdi_writer(bin_dir: Path, facts: dict[str, Any]) -> Callable[[Path], None]:
    def write(spec_dir: Path) -> None:
        started = time.monotonic()
        result = sh(bin_dir / "nvidia-ctk", "cdi", "generate", "--output", spec_dir / "nvidia.yaml",
                    "--nvidia-cdi-hook-path", bin_dir / "nvidia-cdi-hook")  # fmt: skip
        facts["cdi_generate"] = {"rc": result.returncode, "seconds": round(time.monotonic() - started, 2),
                                 "stderr_tail": result.stderr[-1500:]}  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"nvidia-ctk cdi generate failed: {result.stderr[-2000:]}")

    return write


def rendered(carry: Path, variant: str, uuid: str, plugin_image: str) -> list[dict[str, Any]]:
    """The render's objects of the variant (a strategy, or dra, dra-hidden), the placeholder UUID replaced by the
    host's and the plugin's image by the local archive's; nothing else changed."""
    data = json.loads((carry / RENDER_FILE).read_text())
    body, real = data["placeholder"].removeprefix("GPU-"), uuid.removeprefix("GPU-")
    objects: list[dict[str, Any]] = json.loads(json.dumps(data["objects"][variant]).replace(body, real))
    for obj in objects:
        if obj["kind"] == "DaemonSet":
            images.substitute(obj, plugin_image)
    return objects


def unpack_site(carry: Path, work: Path) -> Path:
    """The packages the device lacks, unpacked into a directory of their own: the host tools' (their subprocesses
    get it as PYTHONPATH) and the testbed's API client, which this process imports from it (first on its path: the
    device's own packages stay behind it)."""
    site = work / "site"
    with tarfile.open(carry / SITE) as archive:
        archive.extractall(site, filter="data")
    sys.path.insert(0, str(site))
    return site
