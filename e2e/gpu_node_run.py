"""The node tier on a real GPU host: the control plane, a real kubelet, containerd, runc and NVIDIA's container
runtime over the host's own CDI spec (`nvidia-ctk cdi generate`), and NVIDIA's own device plugin v0.20.0 as this
project renders it; then the routes of ../shared/notes/real-node.md's table under the toolkit's defaults and
hardened, each pod running `nvidia-smi -L`. Writes OUT/h200-real-node.json (docs/measurements/) and OUT/logs.tar.gz.

    python -m e2e.gpu_node_run prepare                  # here: build, pack, render, the plugin's xz -> e2e/.gpu/node
    python3 -m e2e.gpu_node_run run --out "$OUT"        # on the GPU host (device machine), as root
    python -m e2e.gpu_node_run run --out DIR --rehearse # here, without a GPU: the node tier's stand-ins

`prepare` runs `python -m e2e.build --gpu-host` (etcd and the four Kubernetes programs as one multi-call binary,
containerd, runc, the toolkit, pause: one xz stream), renders the stack below with `offline.render` (the DaemonSet,
RuntimeClass, node label, ... exactly as `make render` writes them, the guard's policies left out: this run measures
what the kubelet and the runtime do, not admission), and copies NVIDIA's plugin binary, xz-packed, from
../shared/bin (the module proxy serves none; never part of the project, never a CI dependency).

`run` needs Python 3 and PyYAML (the render is read from e2e/.gpu), and for its host.audit phase the host tools'
requirements: those the device machine lacks (pydantic; protobuf at our version) travel as wheels that `prepare`
downloads, with a CUDA holder (e2e/cuda_hold.c) it builds with cc. The
stack was rendered for a placeholder UUID; `run` puts the host's first GPU's UUID in its place (the UUID and the
volume name derived from it): the one change besides the plugin's image, which is a local OCI archive of NVIDIA's
binary (pull policy Never), as in tests/node. `--rehearse` runs everything but the GPU: the synthetic CDI spec, the
node tier's stand-in plugin, a placeholder UUID; the pods' nvidia-smi is missing there.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import lzma
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common.names import NVIDIA_DRA_DRIVER, PLUGIN_NAME, PLUGIN_NAME_LABEL
from e2e import images
from e2e.build import LINKS
from e2e.controlplane import ControlPlane, poll
from e2e.gpu_pack import GPU_CARRY, NODESET_FILE
from e2e.images import Image
from e2e.node import (
    CHECKPOINT,
    DRA_DRIVER,
    DRA_DRIVER_GROUP,
    HARDENED,
    Node,
    Toolkit,
    claim_results,
    dra_devices,
    grant_dra_driver,
    pod_pid,
    using_claim,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PLUGIN_XZ = "nvidia-device-plugin-v0.20.0.xz"
HOLD = "hidden-gpu-cuda-hold"  # e2e/cuda_hold.c, built by `prepare`
WHEELS = "wheels"
# requirements-host.txt's packages the device machine lacks (../.library/device/KINDS.md lists its image's), at
# constraints.txt's versions; protobuf too, which must not be older than host/podresources' generated code.
DEVICE_LACKS = ("pydantic", "pydantic_core", "annotated-types", "typing-inspection", "typing_extensions", "protobuf")
WHEEL_PLATFORM = ("--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux2014_x86_64",
                  "--platform", "manylinux_2_17_x86_64")  # fmt: skip
PLUGIN_XZ_SHA256 = "beacab4ab734239d66029a077268e249cac1638c7ed03daae7b107da1dfd1348"  # ../shared/bin/README.md
PLUGIN_SHA256 = "58737ebefd1b8fd755292b8b4816d6cff208f6267471c2ce08bd624ab78054d1"
SHARED_PLUGIN = ROOT.parent / "shared" / "bin" / PLUGIN_XZ
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
REGISTRATION = "Got registration request from device plugin"
WAIT_S = 90.0
DEADLINE_S = 540  # the device's `run` stops a command at 600 s: end first, with what was measured
# host.audit's phase: a pod the plugin gave the GPU, and one that asked for none and reached it all the same.
PODS = {"allocated": ("cuda-holder", 1), "zero": ("cuda-zero", 0)}
SETTINGS = {"defaults": (Toolkit(), "envvar"), "hardened": (HARDENED, "volume-mounts")}
# The pod image's one program, dash: what decides the container's GPUs, then nvidia-smi -L, one fact a line.
SCRIPT = """
echo "env NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES-<unset>}"
for f in /dev/nvidia*; do [ -e "$f" ] && echo "dev ${f#/dev/}"; done
for f in /var/run/nvidia-container-devices/*; do [ -e "$f" ] && echo "request ${f##*/}"; done
for f in /run/hidden-gpu-test/gpus/*; do [ -e "$f" ] && echo "cdi-file ${f##*/}"; done
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


def variants() -> dict[str, dict[str, Any]]:
    """The renders `run` applies: the plugin under each strategy, and the DeviceClass of the node allocated by DRA
    with the host's GPU exposed (`dra`) and hidden (`dra-hidden`)."""
    exposed = stack("envvar") | {"hidden-gpu:dra": {}}
    exposed["hidden-gpu:nodes"] = [{"name": NODE, "allocator": "dra", "exposedGpus": [PLACEHOLDER], "hiddenGpus": []}]
    hidden = stack("envvar") | {"hidden-gpu:dra": {}}
    hidden["hidden-gpu:nodes"] = [
        {"name": NODE, "allocator": "dra", "exposedGpus": [ELSEWHERE], "hiddenGpus": [PLACEHOLDER]}
    ]
    return {"envvar": stack("envvar"), "volume-mounts": stack("volume-mounts"), "dra": exposed, "dra-hidden": hidden}


# --- prepare (here) ----------------------------------------------------------------------------------------------


def prepare(plugin_xz: Path) -> int:
    from e2e import build  # noqa: PLC0415 (needs Go; `run` does not)
    from offline.render import render  # noqa: PLC0415 (needs pydantic; the GPU host has none)
    from tests.support.stacks import write_stack  # noqa: PLC0415

    if (code := build.main(["--gpu-host"])) != 0:
        return code
    rendered: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant, config in variants().items():
            (Path(tmp) / variant).mkdir()
            files = render(write_stack(Path(tmp) / variant, config, name="node")).files
            objects = []
            for name, obj in sorted(files.items()):
                if name.startswith("validatingadmissionpolicy"):
                    continue  # admission is not what this run measures
                # A pinned operand (dcgm-exporter): its image is not on the host, and the run measures the plugin.
                if obj["kind"] == "DaemonSet" and obj["metadata"]["labels"].get(PLUGIN_NAME_LABEL) != PLUGIN_NAME:
                    continue
                annotations = obj.get("metadata", {}).get("annotations") or {}
                for key in [k for k in annotations if k.startswith("pulumi.com/")]:
                    del annotations[key]
                objects.append(obj)
            rendered[variant] = sorted(objects, key=lambda o: o["kind"] != "Namespace")
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    changed = subprocess.run([*git, "status", "--porcelain", "--", "e2e", "offline", "components"],
                             capture_output=True, text=True, check=False).stdout.split("\n")  # fmt: skip
    source = {"commit": commit, "uncommitted": sorted(line[3:] for line in changed if line.strip())}
    (GPU_CARRY / RENDER_FILE).write_text(
        json.dumps(
            {
                "placeholder": PLACEHOLDER,
                "source": source,
                "stacks": variants(),
                "objects": rendered,
            }
        )
    )
    data = plugin_xz.read_bytes()
    if hashlib.sha256(data).hexdigest() != PLUGIN_XZ_SHA256:
        print(f"{plugin_xz}: not the sha256 ../shared/bin/README.md names", file=sys.stderr)
        return 1
    (GPU_CARRY / PLUGIN_XZ).write_bytes(data)
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(GPU_CARRY / HOLD), str(HERE / "cuda_hold.c"), "-ldl"], check=True)
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line)
    shutil.rmtree(GPU_CARRY / WHEELS, ignore_errors=True)
    wanted = [f"{name}=={pins[name]}" for name in DEVICE_LACKS]
    download = ["download", "-q", "--no-deps", "--only-binary=:all:", *WHEEL_PLATFORM, "-d", str(GPU_CARRY / WHEELS)]
    subprocess.run([sys.executable, "-m", "pip", *download, *wanted], check=True)
    total = sum(p.stat().st_size for p in GPU_CARRY.rglob("*") if p.is_file())
    print(f"{GPU_CARRY}: {total / 2**20:.1f} MiB to carry (device: 64 MiB with the repository)")
    return 0


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
    if rehearse:
        plugin_image, plugin_files = images.PLUGIN, {"hidden-gpu-test-plugin": bin_dir / "hidden-gpu-test-plugin"}
    else:
        binary = bin_dir / "nvidia-device-plugin"
        # NVIDIA's image's variables (deployments/container/Dockerfile:62-64 of k8s-device-plugin v0.20.0).
        plugin_env = {"NVIDIA_DISABLE_REQUIRE": "true", "NVIDIA_VISIBLE_DEVICES": "all",
                      "NVIDIA_DRIVER_CAPABILITIES": "compute,utility", "LD_LIBRARY_PATH": library_path}  # fmt: skip
        plugin_image = Image("hidden-gpu.test/nvidia-device-plugin:v0.20.0", ("/nvidia-device-plugin",), plugin_env)
        plugin_files = {"nvidia-device-plugin": binary, "etc/ld.so.conf": ld_conf, **libraries(binary), **nvml_needs}
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
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            container["image"], container["imagePullPolicy"] = plugin_image, "Never"
    return objects


class Run:
    def __init__(self, plane: ControlPlane, node: Node, uuid: str, pod_image: str) -> None:
        self.plane, self.node, self.uuid, self.pod_image = plane, node, uuid, pod_image

    def eventually(self, check: Callable[[], Any], what: str, seconds: float = WAIT_S) -> Any:
        return poll(check, seconds, what, interval=0.3)

    def pod(self, name: str, *, gpus: int | None = None, env: dict[str, str] | None = None, then: str = "exit",
            bound: bool = False) -> dict[str, Any]:  # fmt: skip
        """A pod of the pod image; `then` is what it does after nvidia-smi: exit, hold (pause), cuda (hold the GPU)."""
        container: dict[str, Any] = {
            "name": "smi", "image": self.pod_image, "imagePullPolicy": "Never", "args": [then],
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }  # fmt: skip
        if gpus is not None:
            container["resources"] = {"limits": {GPU: str(gpus)}}
        if env:
            container["env"] = [{"name": k, "value": v} for k, v in env.items()]
        spec: dict[str, Any] = {"runtimeClassName": f"hidden-gpu-{NODE}", "restartPolicy": "Never",
                                "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                                "containers": [container]}  # fmt: skip
        if bound:
            spec["nodeName"] = NODE  # past the scheduler: the kubelet's own admission decides
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": TENANT}, "spec": spec}

    def case(self, pod: dict[str, Any], *, expect_refusal: bool = False) -> dict[str, Any]:
        started = time.monotonic()
        self.plane.create(pod)
        return self.view(pod, started, expect_refusal=expect_refusal)

    def view(self, pod: dict[str, Any], started: float, *, expect_refusal: bool = False) -> dict[str, Any]:
        """What the created pod saw, once it has printed it (or failed)."""
        name = pod["metadata"]["name"]

        def finished() -> dict[str, Any] | None:
            current = self.plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods/{name}")
            phase = current["status"].get("phase")
            lines = self.node.logs(TENANT, name) if phase in ("Running", "Succeeded", "Failed") else []
            if phase == "Failed" or "done" in lines:
                return {"pod": current, "lines": lines}
            return None

        result = self.eventually(finished, f"pod {name} finished", 30 if expect_refusal else WAIT_S)
        current, lines = result["pod"], result["lines"]
        smi = [line.removeprefix("smi ") for line in lines if line.startswith("smi ")]
        seen = sorted(set(UUID.findall("\n".join(smi))) | {ln.split()[1] for ln in lines if ln.startswith("cdi-file ")})
        entry = self.checkpoint_entry(current)
        return {
            "request": pod["spec"]["containers"][0].get("resources", {}).get("limits", {}),
            "env": {e["name"]: e["value"] for e in pod["spec"]["containers"][0].get("env", [])},
            "phase": current["status"].get("phase"),
            "reason": current["status"].get("reason"),
            "message": current["status"].get("message"),
            "seen": seen,
            "sees_exactly_allocated": seen == sorted(entry.get("DeviceIDs", [])) if entry else None,
            "lines": lines,
            "allocated": sorted(entry.get("DeviceIDs", [])) if entry else [],
            "alloc_response": decode_alloc(entry["AllocResp"]) if entry else None,
            "seconds": round(time.monotonic() - started, 2),
        }

    def checkpoint_entry(self, pod: dict[str, Any]) -> dict[str, Any]:
        for entry in self.node.checkpoint().get("PodDeviceEntries") or []:
            if entry["PodUID"] == pod["metadata"]["uid"] and entry["ResourceName"] == GPU:
                ids = entry["DeviceIDs"]
                flat = [i for group in ids.values() for i in group] if isinstance(ids, dict) else ids
                return {"DeviceIDs": flat, "AllocResp": entry["AllocResp"]}
        return {}

    def delete_pods(self) -> None:
        self.plane.request("DELETE", f"/api/v1/namespaces/{TENANT}/pods")
        self.eventually(lambda: not self.plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods")["items"],
                        "tenant pods deleted")  # fmt: skip

    def plugin_pod(self, strategy: str) -> dict[str, Any]:
        pods = self.plane.request("GET", f"/api/v1/namespaces/{PLUGIN_NAMESPACE}/pods")["items"]
        for pod in pods:
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
            running = pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")
            if env.get("DEVICE_LIST_STRATEGY") == strategy and running:
                return dict(pod)
        return {}


def plugin_process(names: tuple[str, ...]) -> dict[str, str]:
    """/proc/<pid>/status of the plugin's process, as the host sees it: what runc applied."""
    for proc in Path("/proc").iterdir():
        with suppress(OSError):
            if (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace") in names:
                lines = (proc / "status").read_text().splitlines()
                status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
                return {k: status[k].strip() for k in ("Seccomp", "NoNewPrivs", "CapEff", "CapBnd", "Uid")}
    return {}


def decode_alloc(encoded: str) -> dict[str, Any]:
    """A checkpointed ContainerAllocateResponse (k8s.io/kubelet v0.36.3 pkg/apis/deviceplugin/v1beta1/api.proto:
    177-188): envs = 1, mounts = 2 (container_path, host_path, read_only), devices = 3, annotations = 4,
    cdi_devices = 5."""

    def fields(data: bytes) -> list[tuple[int, Any]]:
        out: list[tuple[int, Any]] = []
        i = 0
        while i < len(data):
            key, i = varint(data, i)
            number, wire = key >> 3, key & 7
            value: int | bytes
            if wire == 0:
                value, i = varint(data, i)
            elif wire == 2:
                length, i = varint(data, i)
                value, i = data[i : i + length], i + length
            else:
                raise ValueError(f"wire type {wire}")
            out.append((number, value))
        return out

    def varint(data: bytes, i: int) -> tuple[int, int]:
        shift = result = 0
        while True:
            byte = data[i]
            result, i, shift = result | (byte & 0x7F) << shift, i + 1, shift + 7
            if not byte & 0x80:
                return result, i

    def text(message: bytes) -> dict[int, Any]:
        return {n: v.decode(errors="replace") if isinstance(v, bytes) else v for n, v in fields(message)}

    result: dict[str, Any] = {"envs": {}, "mounts": [], "devices": [], "annotations": {}, "cdi_devices": []}
    for number, value in fields(base64.b64decode(encoded)):
        part = text(value)
        if number in (1, 4):
            result["envs" if number == 1 else "annotations"][part.get(1, "")] = part.get(2, "")
        elif number == 2:
            result["mounts"].append(
                {"container_path": part.get(1), "host_path": part.get(2), "read_only": bool(part.get(3))}
            )
        elif number == 3:
            result["devices"].append(
                {"container_path": part.get(1), "host_path": part.get(2), "permissions": part.get(3)}
            )
        elif number == 5:
            result["cdi_devices"].append(part.get(1))
    return result


def setting_run(run: Run, carry: Path, name: str, plugin_image: str, plugin_names: tuple[str, ...]) -> dict[str, Any]:
    toolkit, strategy = SETTINGS[name]
    run.node.toolkit(toolkit)
    out: dict[str, Any] = {"toolkit": {"accept-nvidia-visible-devices-envvar-when-unprivileged":
                                       toolkit.envvar_when_unprivileged,
                                       "accept-nvidia-visible-devices-as-volume-mounts": toolkit.volume_mounts},
                           "strategy": strategy}  # fmt: skip
    started = time.monotonic()
    for obj in rendered(carry, strategy, run.uuid, plugin_image):
        run.plane.apply(obj, manager="hidden-gpu")
    pod = run.eventually(lambda: run.plugin_pod(strategy), f"the {strategy} plugin pod Running")
    out["plugin_running_s"] = round(time.monotonic() - started, 2)
    try:
        run.eventually(
            lambda: run.node.checkpoint().get("RegisteredDevices", {}).get(GPU) == [run.uuid] and
            run.node.allocatable() == 1, "the plugin registered the GPU", 60)  # fmt: skip
        out["plugin_registered_s"] = round(time.monotonic() - started, 2)
    except RuntimeError as error:  # measure the routes that need no plugin all the same
        out["plugin_registered_s"], out["plugin_error"] = None, str(error)[-1000:]
    (container,) = pod["spec"]["containers"]
    out["plugin"] = {
        "image": container["image"],
        "env": {e["name"]: e.get("value") for e in container.get("env", [])},
        "securityContext": container.get("securityContext"),
        "podSecurityContext": pod["spec"].get("securityContext"),
        "volumeMounts": container.get("volumeMounts"),
        "runtimeClassName": pod["spec"].get("runtimeClassName"),
        "process": plugin_process(plugin_names),
        "RegisteredDevices": run.node.checkpoint().get("RegisteredDevices"),
        "node_capacity": run.node.node()["status"]["capacity"].get(GPU),
        "node_allocatable": run.node.node()["status"]["allocatable"].get(GPU),
        "log": run.node.logs(PLUGIN_NAMESPACE, pod["metadata"]["name"])[-40:],
    }
    cases: dict[str, Any] = {}
    if out["plugin_registered_s"] is not None:
        cases["allocated"] = run.case(run.pod("one-gpu", gpus=1, then="hold"))
        cases["second"] = run.case(run.pod("one-too-many", gpus=1, bound=True), expect_refusal=True)
        run.delete_pods()
    cases["zero"] = run.case(run.pod("zero-gpus", gpus=0))
    cases["env-uuid"] = run.case(run.pod("env-uuid", env={"NVIDIA_VISIBLE_DEVICES": run.uuid}))
    cases["void"] = run.case(run.pod("env-void", env={"NVIDIA_VISIBLE_DEVICES": "void"}))
    run.delete_pods()
    out["cases"] = cases
    return out


def dra_run(run: Run, carry: Path) -> dict[str, Any]:
    """One claim through the kubelet's DRA manager and containerd's CDI injection of the host's own spec. The stand-in
    for NVIDIA's DRA kubelet plugin (e2e/go/dra) publishes the host's GPU; a tenant's claim of the stack's DeviceClass
    stays unallocated while the stack hides the GPU (the class selects other UUIDs), and once the stack exposes it
    (the same class applied again) the scheduler allocates it and the pod's nvidia-smi sees the GPU. The pod runs
    under the default runtime, runc: containerd injects the claim's devices itself."""
    plane, node = run.plane, run.node
    grant_dra_driver(plane)
    node.start_dra_plugin(plane.kubeconfig(DRA_DRIVER), NVIDIA_DRA_DRIVER, [run.uuid])
    devices = run.eventually(lambda: dra_devices(plane, NODE, NVIDIA_DRA_DRIVER), "the driver's ResourceSlice")
    out: dict[str, Any] = {"published": devices}

    def apply_class(variant: str) -> str:
        (device_class,) = [o for o in rendered(carry, variant, run.uuid, "") if o["kind"] == "DeviceClass"]
        plane.apply(device_class, manager="hidden-gpu")
        out[f"class_{variant}"] = device_class["spec"]["selectors"]
        return str(device_class["metadata"]["name"])

    def allocated() -> list[str]:
        return [devices.get(r["device"], r["device"]) for r in claim_results(plane, TENANT, "gpu")]

    def unschedulable() -> list[dict[str, Any]]:
        current = plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods/dra-claim")
        conditions = current["status"].get("conditions", [])
        return [c for c in conditions if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"]

    class_name = apply_class("dra-hidden")
    request = {"name": "gpu", "exactly": {"deviceClassName": class_name}}
    metadata = {"name": "gpu", "namespace": TENANT}
    plane.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata,
                  "spec": {"devices": {"requests": [request]}}})  # fmt: skip
    pod = using_claim(run.pod("dra-claim"), "gpu")
    started = time.monotonic()
    plane.create(pod)
    scheduled = run.eventually(unschedulable, "the claim's pod unschedulable while the stack hides the GPU")
    time.sleep(10)  # and still so after the scheduler's retries
    out["while_hidden"] = {"allocated": allocated(), "scheduled": scheduled, "still": unschedulable()}
    if out["while_hidden"]["allocated"] or not out["while_hidden"]["still"]:
        raise RuntimeError(f"a class of a stack that hides the GPU let the claim through: {out['while_hidden']}")
    apply_class("dra")
    out["while_exposed"] = run.view(pod, started) | {"allocated": allocated()}
    run.delete_pods()
    node.stop_dra_plugin()
    return out


def audit_run(run: Run, carry: Path, site: Path | None, rehearse: bool) -> dict[str, Any]:
    """host.audit as an operator runs it on this host: NVML (a host record when rehearsed), the real kubelet's
    PodResources socket, the pods' cgroups and log directories. Two pods hold the GPU with a CUDA context under the
    toolkit's defaults and no guard: one the plugin allocated it to, one that asked for zero GPUs and reached it through
    the image's NVIDIA_VISIBLE_DEVICES=all. Against the stack that exposes the GPU the audit should name the second
    (a GPU the kubelet did not allocate to it); against the stack that hides it, both (a hidden GPU)."""
    pods = {case: run.pod(name, gpus=gpus, then="cuda") for case, (name, gpus) in PODS.items()}
    for pod in pods.values():
        run.plane.create(pod)
    out: dict[str, Any] = {}
    for case, pod in pods.items():
        name = pod["metadata"]["name"]

        def holding(name: str = name) -> list[str] | None:
            return [line for line in run.node.logs(TENANT, name) if line.startswith("hold")] or None

        lines = run.eventually(holding, f"pod {name} holding the GPU")
        current = run.plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods/{name}")
        out[case] = {"hold": lines, "pid": pod_pid(current["metadata"]["uid"], b"/hold"),
                     "allocated": run.checkpoint_entry(current).get("DeviceIDs", [])}  # fmt: skip
    if not rehearse:
        query = sh("nvidia-smi", "--query-compute-apps=pid,gpu_uuid,process_name", "--format=csv,noheader")
        out["nvidia-smi compute apps"] = query.stdout.splitlines() or query.stderr[-500:]
    data = json.loads((carry / RENDER_FILE).read_text())
    tmp = Path(tempfile.mkdtemp(prefix="hidden-gpu-audit-"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (site, ROOT) if p)}
    for stack_name, variant in (("exposed", "envvar"), ("hidden", "dra-hidden")):
        stack_file = tmp / f"Pulumi.{stack_name}.yaml"
        config = json.loads(json.dumps(data["stacks"][variant]).replace(PLACEHOLDER, run.uuid))
        stack_file.write_text(yaml.safe_dump({"config": config}, sort_keys=False))
        command = [sys.executable, "-m", "host.audit", "--stack-file", str(stack_file), "--node", NODE, "--json",
                   *run.node.audit_sources(tmp)]  # fmt: skip
        if rehearse:  # no NVML here: the host record says the GPU runs both holders
            record = tmp / "record.json"
            pids = [{"pid": out[case]["pid"]} for case in pods]
            record.write_text(json.dumps([{"uuid": run.uuid, "processes": pids}]))
            command += ["--record", str(record)]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
        try:
            report: Any = json.loads(done.stdout)
        except ValueError:
            report = done.stdout[-2000:]
        out[f"audit {stack_name}"] = {"stack": variant, "rc": done.returncode, "report": report,
                                      "stderr": done.stderr[-2000:]}  # fmt: skip
    shutil.rmtree(tmp, ignore_errors=True)
    run.delete_pods()
    return out


def restart_run(run: Run, strategy: str) -> dict[str, Any]:
    """NVIDIA's plugin across a kubelet restart (an upgrade, a reinstall): the kubelet comes back with an empty
    registry and kubelet.sock made anew, and the plugin must see that and register again on its own, its pod left
    running. Then two one-GPU pods: one at once, one once the first has its answer. The first can be refused: the
    checkpoint may still hold a deleted pod's GPU, and the device manager drops such entries only once all pod sources
    are ready (UpdateAllocatedDevices, pkg/kubelet/cm/devicemanager/manager.go:557-564 of v1.36.3)."""
    before = run.plugin_pod(strategy)
    live = {p["metadata"]["uid"] for p in run.plane.request("GET", "/api/v1/pods")["items"]}
    entries = run.node.checkpoint().get("PodDeviceEntries") or []
    out: dict[str, Any] = {"checkpoint_before": [{"pod": e["PodUID"], "resource": e["ResourceName"],
                                                  "pod_exists": e["PodUID"] in live} for e in entries]}  # fmt: skip
    logged = len(run.node.log("kubelet"))
    started = time.monotonic()
    run.node.restart_kubelet()

    def registered() -> bool:
        # The new kubelet's own line for a plugin's Register call (pkg/kubelet/cm/devicemanager/plugin/v1beta1/
        # server.go:161 of v1.36.3): the node's status and the checkpoint still show the old registration until then.
        again = REGISTRATION in run.node.log("kubelet")[logged:]
        return again and run.node.checkpoint().get("RegisteredDevices", {}).get(GPU) == [run.uuid]

    run.eventually(registered, "NVIDIA's plugin registered again after the kubelet restart", 60)
    out["registered_s"] = round(time.monotonic() - started, 2)
    after = run.plugin_pod(strategy)
    out["plugin_pod"] = {
        "same": after.get("metadata", {}).get("uid") == before["metadata"]["uid"],
        "restartCount": [s.get("restartCount") for s in after.get("status", {}).get("containerStatuses", [])],
        "log": run.node.logs(PLUGIN_NAMESPACE, before["metadata"]["name"])[-12:],
    }
    out["at_once"] = run.case(run.pod("after-restart", gpus=1), expect_refusal=True)
    run.delete_pods()
    out["then"] = run.case(run.pod("after-restart-then", gpus=1))
    out["then"]["after_restart_s"] = round(time.monotonic() - started, 2)
    run.delete_pods()
    return out


def install_wheels(carry: Path, work: Path) -> Path:
    """The host tools' packages the device lacks, installed from the carried wheels into a directory of their own."""
    site = work / "site"
    sh(sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", site,
       *sorted((carry / WHEELS).glob("*.whl")), check=True, timeout=120)  # fmt: skip
    return site


def collect_logs(out: Path, node: Node | None, plane: ControlPlane | None, extra: dict[str, str]) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for name, text in extra.items():
            add(name, text.encode())
        for base in (node.root if node else None, plane.root if plane else None):
            if base is None:
                continue
            patterns = (
                "*.log",
                "toolkit/*",
                "cdi/*",
                "pod-logs/**/*.log",
                "kubelet/config.yaml",
                "containerd/config.toml",
            )
            for path in [found for pattern in patterns for found in base.glob(pattern)]:
                with suppress(OSError):
                    if path.is_file() and path.stat().st_size < 20 * 2**20:
                        add(f"{base.name}/{path.relative_to(base)}", path.read_bytes())
        with suppress(OSError):
            add("kubelet_internal_checkpoint", CHECKPOINT.read_bytes())
    (out / "logs.tar.gz").write_bytes(buffer.getvalue())


class DeadlineError(Exception):
    pass


@dataclass
class Held:
    """What a GPU-host run holds, for its logs whatever happens: its work directory, plane and node."""

    work: Path
    plane: ControlPlane | None = None
    node: Node | None = None
    extra: dict[str, str] = field(default_factory=dict)


@contextmanager
def device_run(out: Path, result: dict[str, Any], prefix: str, seconds: int) -> Iterator[Held]:
    """The run's frame: its own deadline, what failed written into `result` with the logs, the work directory gone."""
    out.mkdir(parents=True, exist_ok=True)
    held = Held(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        with deadline(seconds):
            yield held
    except Exception as error:  # what failed goes into the result, with the logs
        result["error"] = f"{type(error).__name__}: {error}"[-4000:]
        if not (out / "logs.tar.gz").exists():
            collect_logs(out, held.node, held.plane, held.extra)
    finally:
        shutil.rmtree(held.work, ignore_errors=True)


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    def expired(signum: int, frame: Any) -> None:
        raise DeadlineError(f"the run's own deadline ({seconds} s) passed")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run(carry: Path, out: Path, rehearse: bool) -> int:  # noqa: PLR0915 (one run, in order)
    began = time.monotonic()
    result: dict[str, Any] = {
        "what": "The node tier on a GPU host: e2e/gpu_node_run.py (issue 30)",
        "command": "python3 -m e2e.gpu_node_run run --out $OUT" + (" --rehearse" if rehearse else ""),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rehearsal": rehearse,
        "source": json.loads((carry / RENDER_FILE).read_text()).get("source"),  # what `prepare` ran at
        "timings_s": {},
    }
    timings = result["timings_s"]
    with device_run(out, result, "hidden-gpu-gpu-node-", DEADLINE_S) as held:
        facts = result["host"] = host_facts(rehearse)
        bin_dir = held.work / "bin"
        packed = unpack(carry, bin_dir, rehearse)
        timings["unpack"] = round(time.monotonic() - began, 2)
        site = None if rehearse else install_wheels(carry, held.work)  # rehearsed here, the venv has them
        result["versions"] = {
            **packed["versions"],
            "binaries": {n: sh(bin_dir / n, "--version").stdout.strip().splitlines()[:1] for n in
                         ("kubelet", "etcd", "containerd", "runc", "nvidia-ctk", "nvidia-container-runtime")},
        }  # fmt: skip
        uuid = PLACEHOLDER if rehearse else facts["gpus"][0]["uuid"]
        if not rehearse:
            result["versions"]["nvidia-device-plugin"] = {
                "sha256": PLUGIN_SHA256, "version": sh(bin_dir / "nvidia-device-plugin", "--version").stdout.strip()
            }  # fmt: skip
        spec_dir = held.work / "spec"  # the images need the spec's NVML directory before the node starts
        spec_dir.mkdir()
        writer = None if rehearse else cdi_writer(bin_dir, facts)
        if writer:
            writer(spec_dir)
            spec = (spec_dir / "nvidia.yaml").read_text()
            held.extra["nvidia.yaml"] = spec
            result["cdi_spec"] = {"devices": re.findall(r"^- name: \"?([^\"\n]+)\"?$", spec, re.M) or
                                  re.findall(r"^\s+- name: \"?([^\"\n]+)\"?$", spec, re.M)}  # fmt: skip
        node_images = make_images(bin_dir, held.work / "images", rehearse, spec_dir, carry / HOLD)
        pod_image, plugin_image = node_images[1][0].name, node_images[2][0].name
        result["images"] = {i.name: {"env": i.env, "files": sorted(f)} for i, f in node_images}
        with ControlPlane.start(bin_dir, controllers=("node-lifecycle-controller",),
                                identities={f"system:node:{NODE}": ["system:nodes"],
                                            DRA_DRIVER: [DRA_DRIVER_GROUP]}) as plane:  # fmt: skip
            held.plane = plane
            timings["control_plane"] = round(time.monotonic() - began - timings["unpack"], 2)
            plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": TENANT}})

            def copy(directory: Path) -> None:
                shutil.copy(spec_dir / "nvidia.yaml", directory / "nvidia.yaml")

            with Node.start(plane, bin_dir, NODE, [uuid], cdi=copy if writer else None, own_images=node_images) as node:
                held.node = node
                timings["node_containerd_and_images"] = round(node.timings["containerd"], 2)
                timings["node_ready"] = round(node.timings["ready"], 2)
                try:
                    this = Run(plane, node, uuid, pod_image)
                    # No plugin yet: the kubelet drops the unserved request (its admission removes extended
                    # resources the node does not have), and the pod runs with the image's ENV.
                    # The render's RuntimeClass, node label and namespace, without the plugin's DaemonSet yet.
                    for obj in rendered(carry, "envvar", uuid, plugin_image):
                        if obj["kind"] != "DaemonSet":
                            plane.apply(obj, manager="hidden-gpu")
                    result["unserved"] = {}
                    for name, (toolkit, _) in SETTINGS.items():
                        node.toolkit(toolkit)
                        result["unserved"][name] = this.case(this.pod(f"unserved-{name}", gpus=1, bound=True))
                    this.delete_pods()
                    names = ("/hidden-gpu-test-plugin",) if rehearse else ("/nvidia-device-plugin",)
                    result["settings"] = {}
                    for name in SETTINGS:
                        started = time.monotonic()
                        result["settings"][name] = setting_run(this, carry, name, plugin_image, names)
                        timings[f"setting_{name}"] = round(time.monotonic() - started, 2)
                        if name == "defaults":  # the plugin serves the GPU and the zero route is open
                            started = time.monotonic()
                            result["audit"] = audit_run(this, carry, site, rehearse)
                            timings["audit"] = round(time.monotonic() - started, 2)
                    started = time.monotonic()
                    result["kubelet_restart"] = restart_run(this, SETTINGS["hardened"][1])
                    timings["kubelet_restart"] = round(time.monotonic() - started, 2)
                    started = time.monotonic()
                    result["dra"] = dra_run(this, carry)
                    timings["dra"] = round(time.monotonic() - started, 2)
                finally:
                    collect_logs(out, node, plane, held.extra)
    timings["total"] = round(time.monotonic() - began, 2)
    result["summary"] = summary(result)
    (out / "h200-real-node.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 1 if "error" in result else 0


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The table of ../shared/notes/real-node.md, from what ran: per case and setting, the UUIDs the pod saw."""
    table: dict[str, Any] = {}
    for name in SETTINGS:
        row = (result.get("settings") or {}).get(name) or {}
        cases = row.get("cases") or {}
        unserved = (result.get("unserved") or {}).get(name) or {}
        table[name] = {
            "plugin RegisteredDevices": (row.get("plugin") or {}).get("RegisteredDevices"),
            **{case: {"phase": c.get("phase"), "reason": c.get("reason"), "seen": c.get("seen"),
                      "allocated": c.get("allocated")} for case, c in cases.items()},
            "unserved": {"phase": unserved.get("phase"), "seen": unserved.get("seen")},
        }  # fmt: skip
    dra = result.get("dra") or {}
    table["dra"] = {
        "published": sorted((dra.get("published") or {}).values()),
        "while hidden": {
            "allocated": (dra.get("while_hidden") or {}).get("allocated"),
            "unschedulable": [c.get("message") for c in (dra.get("while_hidden") or {}).get("still", [])],
        },
        "while exposed": {k: (dra.get("while_exposed") or {}).get(k) for k in ("allocated", "phase", "seen")},
    }
    restart = result.get("kubelet_restart") or {}
    table["kubelet restart"] = {
        "registered_s": restart.get("registered_s"),
        "plugin pod": {k: (restart.get("plugin_pod") or {}).get(k) for k in ("same", "restartCount")},
        "stale checkpoint entries": [e for e in restart.get("checkpoint_before", []) if not e["pod_exists"]],
        **{
            f"pod {when}": {k: (restart.get(when) or {}).get(k) for k in ("phase", "reason", "seen", "allocated")}
            for when in ("at_once", "then")
        },
    }
    audit = result.get("audit") or {}
    table["audit"] = {
        "holders": {case: {k: (audit.get(case) or {}).get(k) for k in ("hold", "allocated")} for case in PODS},
        **{name: findings(audit.get(f"audit {name}") or {}) for name in ("exposed", "hidden")},
    }
    if "error" in result:
        table["error"] = result["error"][:500]
    return table


def findings(audit: dict[str, Any]) -> dict[str, Any]:
    """An audit's status and its violations, a line each: the pod or process and what it does."""
    report = audit.get("report")
    if not isinstance(report, dict):
        return {"rc": audit.get("rc"), "output": report, "stderr": audit.get("stderr")}
    return {
        "rc": audit.get("rc"),
        "violations": [
            f"{v.get('pod') or v.get('pid') or v.get('uuid')}: {v['message']}" for v in report["violations"]
        ],
    }


def device_main(
    argv: list[str] | None,
    doc: str,
    *,
    carry: Path,
    plugin_xz: Path,
    prepare: Callable[[Path], int],
    run: Callable[[Path, Path, bool], int],
    rehearsal: bool,
) -> int:
    """A GPU-host run's two verbs: `prepare` here, `run` there as root (and `--rehearse` here, where it has one)."""
    prog = f"python -m e2e.{doc.split(maxsplit=1)[0]}"
    parser = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[1],
        epilog=doc.split("\n\n")[2],  # the usage lines: each verb's flags
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="verb", required=True)
    prep = sub.add_parser("prepare", help=f"build, pack, render and copy the plugin into {carry}")
    prep.add_argument("--plugin-xz", type=Path, default=plugin_xz)
    go = sub.add_parser("run", help="run the node and the cases; as root")
    go.add_argument("--out", type=Path, required=True)
    go.add_argument("--carry", type=Path, default=carry)
    if rehearsal:
        go.add_argument("--rehearse", action="store_true", help="no GPU: the synthetic spec and the stand-in plugin")
    args = parser.parse_args(argv)
    if args.verb == "prepare":
        return prepare(args.plugin_xz)
    if os.geteuid() != 0:
        print(f"{prog}: runs containerd and a kubelet: run it as root", file=sys.stderr)
        return 2
    return run(args.carry, args.out, getattr(args, "rehearse", False))


def main(argv: list[str] | None = None) -> int:
    return device_main(
        argv,
        f"gpu_node_run\n\n{__doc__}",
        carry=GPU_CARRY,
        plugin_xz=SHARED_PLUGIN,
        prepare=prepare,
        run=run,
        rehearsal=True,
    )


if __name__ == "__main__":
    sys.exit(main())
