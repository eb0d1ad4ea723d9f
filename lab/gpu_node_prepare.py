"""`python -m lab.gpu_node_run prepare`, here: the GPU host's binaries built and packed, the stacks rendered, NVIDIA's
plugin copied from ../shared/bin, the wheels and the CUDA holder, all into lab/.gpu/node."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from common.names import PLUGIN_NAME, PLUGIN_NAME_LABEL
from lab.gpu_host import (
    ELSEWHERE,
    HERE,
    HOLD,
    NODE,
    PLACEHOLDER,
    PLUGIN_XZ,
    RENDER_FILE,
    ROOT,
    SITE,
    stack,
)
from lab.gpu_pack import GPU_CARRY, pack_gpu_host

# requirements-host.txt's packages the device machine lacks (../.library/device/KINDS.md lists its image's), at
# constraints.txt's versions; protobuf too, which must not be older than host/podresources' generated code; and the
# testbed's API client (e2e.controlplane), the `kubernetes` package with what it imports.
DEVICE_LACKS = ("pydantic", "pydantic_core", "annotated-types", "typing-inspection", "typing_extensions", "protobuf")
TESTBED_CLIENT = ("kubernetes", "urllib3", "certifi", "charset-normalizer", "idna", "requests", "python-dateutil",
                  "durationpy", "oauthlib", "requests-oauthlib", "websocket-client")  # fmt: skip
WHEEL_PLATFORM = ("--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux2014_x86_64",
                  "--platform", "manylinux_2_17_x86_64")  # fmt: skip
PLUGIN_XZ_SHA256 = "beacab4ab734239d66029a077268e249cac1638c7ed03daae7b107da1dfd1348"  # ../shared/bin/README.md
SHARED_PLUGIN = ROOT.parent / "shared" / "bin" / PLUGIN_XZ


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

    code, built = build.build_groups(gpu_host=True)
    if code != 0:
        return code
    pack_gpu_host(built)
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
    changed = subprocess.run([*git, "status", "--porcelain", "--", "e2e", "lab", "offline", "components"],
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
    wanted = [f"{name}=={pins[name]}" for name in (*DEVICE_LACKS, *TESTBED_CLIENT)]
    shutil.rmtree(GPU_CARRY / "wheels", ignore_errors=True)  # how earlier carries held them
    with tempfile.TemporaryDirectory() as tmp:
        wheels, site = Path(tmp) / "wheels", Path(tmp) / "site"
        download = ["download", "-q", "--no-deps", "--only-binary=:all:", *WHEEL_PLATFORM, "-d", str(wheels)]
        subprocess.run([sys.executable, "-m", "pip", *download, *wanted], check=True)
        for wheel in sorted(wheels.glob("*.whl")):  # a wheel installs by unpacking (none of these has a .data)
            with zipfile.ZipFile(wheel) as unpacked:
                unpacked.extractall(site)
        with tarfile.open(GPU_CARRY / SITE, "w:xz") as archive:
            archive.add(site, arcname=".")
    total = sum(p.stat().st_size for p in GPU_CARRY.rglob("*") if p.is_file())
    print(f"{GPU_CARRY}: {total / 2**20:.1f} MiB to carry (device: 64 MiB with the repository)")
    return 0
