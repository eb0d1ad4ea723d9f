"""Container images without a registry, for the node tier: a one-layer OCI image archive made from local files
(our static programs from e2e/go/node), imported into containerd's `k8s.io` namespace with `ctr images import`,
so pods run them with `imagePullPolicy: Never`.

    archive = oci_archive(PROBE, {"probe": LINKS / "probe"}, directory)
    import_archive(ctr, socket, archive, snapshotter)

The archive is an OCI image layout (oci-layout, index.json, blobs/sha256/...) in a tar file, byte-identical
for the same inputs: every timestamp 0, every owner root.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"
INDEX = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class Image:
    """An image of one layer: `files` maps a path in the image (no leading /) to a file here, mode 0755."""

    name: str
    """A full reference, e.g. hidden-gpu.test/probe:1 (the registry host is never contacted)."""
    entrypoint: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


# The sandbox (pause) image containerd pins, the probe every test pod runs and the stand-in plugin's image.
# The probe's image sets NVIDIA_VISIBLE_DEVICES=all as NVIDIA's CUDA images do: the route a pod takes by
# asking for no GPU at all.
PAUSE = Image("hidden-gpu.test/pause:1", ("/pause",))
PROBE = Image("hidden-gpu.test/probe:1", ("/probe",), {"NVIDIA_VISIBLE_DEVICES": "all"})
# The stand-ins that need a shell take this machine's (host_programs), from this PATH.
HOST_PATH = "/usr/bin:/bin"
# NVIDIA's plugin image sets the same variables (deployments/container/Dockerfile:62-64 of k8s-device-plugin
# v0.20.0); the rendered DaemonSet's env overrides NVIDIA_VISIBLE_DEVICES. It has a shell too, busybox's on PATH
# (:46-60): the stand-in has this machine's sh and sleep, what the rendered wait for other plugins runs.
PLUGIN = Image(
    "hidden-gpu.test/device-plugin-stand-in:1",
    ("/hidden-gpu-test-plugin",),
    {
        "PATH": HOST_PATH,
        "NVIDIA_DISABLE_REQUIRE": "true",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    },
)
# NVIDIA's plugin image carries gpu-feature-discovery at /usr/bin (deployments/container/Dockerfile:91-96 of
# k8s-device-plugin v0.20.0): the rendered GFD runs it by name; the stand-in GFD under that name, with the image's ENV.
GFD = Image(
    "hidden-gpu.test/gpu-feature-discovery-stand-in:1",
    ("/usr/bin/gpu-feature-discovery",),
    {"PATH": "/usr/bin", "NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
)
# dcgm-exporter's image sets NVIDIA_VISIBLE_DEVICES=all too (docker/Dockerfile.ubuntu:84 of dcgm-exporter
# 4.3.1-4.4.0); the rendered DaemonSet runs its entrypoint.
DCGM_EXPORTER = Image(
    "hidden-gpu.test/dcgm-exporter-stand-in:1",
    ("/hidden-gpu-test-dcgm-exporter",),
    {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
)
# NVIDIA's DRA driver image runs gpu-kubelet-plugin from PATH and sets NVIDIA_VISIBLE_DEVICES=all (dra-driver-nvidia-gpu
# v0.4.1 deployments/container/Dockerfile:113); the rendered DaemonSet runs it by name, its env overriding the variable.
DRA_PLUGIN = Image(
    "hidden-gpu.test/dra-kubelet-plugin-stand-in:1",
    ("/usr/bin/gpu-kubelet-plugin",),
    {"PATH": "/usr/bin", "NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
)
PATH_ENV = "/"
# The GPU Operator's own device-plugin DaemonSet (tests/node/test_operator_takeover.py) runs `/bin/bash -c
# /bin/entrypoint.sh`, the operator's script that waits for the validator's files, `cat`s and sources one, then execs
# `nvidia-device-plugin` from PATH; its init container runs `sh -c` in the validator's image
# (gpu-operator@d73a0086a6ba assets/state-device-plugin/0400_configmap.yaml, 0500_daemonset.yaml:27-31, 62-64). The
# stand-ins: this machine's bash, cat and sh with their libraries, and the stand-in plugin under NVIDIA's name.
OPERATOR_PLUGIN = Image(
    "hidden-gpu.test/operator-device-plugin-stand-in:1",
    ("/bin/bash",),
    {"PATH": HOST_PATH, "NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
)
OPERATOR_VALIDATOR = Image("hidden-gpu.test/operator-validator-stand-in:1", ("/bin/sh",), {"PATH": HOST_PATH})


def substitute(daemon_set: dict[str, Any], image: str) -> None:
    """A rendered DaemonSet's one container runs `image`, imported locally (pull policy Never), and so does an init
    container in the same image (the plugin's wait for other plugins): NVIDIA's images cannot be had here."""
    pod = daemon_set["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    for same in [c for c in pod.get("initContainers", []) if c["image"] == container["image"]] + [container]:
        same["image"], same["imagePullPolicy"] = image, "Never"


def host_programs(*programs: str) -> dict[str, Path]:
    """This machine's programs at their own paths, with the shared libraries `ldd` names for them (and the dynamic
    loader), each at the path it names: enough for a program of the C library alone."""
    files: dict[str, Path] = {}
    for program in programs:
        files[program] = Path(program).resolve()
        listed = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
        for line in listed.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
            if path.startswith("/"):
                files[path] = Path(path).resolve()
    return files


def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _add(tar, f"blobs/sha256/{digest.removeprefix('sha256:')}", data, 0o644)
    return {"digest": digest, "size": len(data)}


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def layer(files: dict[str, Path]) -> bytes:
    """An uncompressed layer tar holding each file at its path, executable, owned by root."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, source in sorted(files.items()):
            _add(tar, name.lstrip("/"), source.read_bytes(), 0o755)
    return buffer.getvalue()


def oci_archive(image: Image, files: dict[str, Path], directory: Path) -> Path:
    """Write the image as an OCI layout tar in `directory`; returns its path."""
    layer_bytes = layer(files)
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    env = [f"{k}={v}" for k, v in {"PATH": PATH_ENV, **image.env}.items()]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": env, "Entrypoint": list(image.entrypoint)},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "e2e/images.py: one layer of local files"}],
    }
    path = directory / (image.name.replace("/", "_").replace(":", "_") + ".tar")
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        layer_ref = {"mediaType": LAYER, **_blob(tar, layer_bytes)}
        config_ref = {"mediaType": CONFIG, **_blob(tar, _json(config))}
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "config": config_ref, "layers": [layer_ref]}
        manifest_ref = {"mediaType": MANIFEST, **_blob(tar, _json(manifest))}
        # containerd names the imported image by this annotation (its archive importer reads it).
        manifest_ref["annotations"] = {
            "io.containerd.image.name": image.name,
            "org.opencontainers.image.ref.name": image.name.rsplit(":", 1)[1],
        }
        _add(tar, "index.json", _json({"schemaVersion": 2, "mediaType": INDEX, "manifests": [manifest_ref]}), 0o644)
        _add(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}), 0o644)
    return path


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def import_archive(ctr: Path, address: Path, archive: Path, snapshotter: str) -> None:
    """Import into containerd's k8s.io namespace (the CRI plugin's), unpacked for the kubelet's snapshotter."""
    subprocess.run(
        [str(ctr), "--address", str(address), "--namespace", "k8s.io", "images", "import",
         "--snapshotter", snapshotter, "--platform", "linux/amd64", str(archive)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
