"""The GPU host run's node set: the programs e2e.build made that the GPU host runs, packed into one xz stream
small enough for the device machine's carry (lab/gpu_node_run.py, lab/gpu_dra_run.py unpack it there)."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GPU_CARRY = HERE / ".gpu" / "node"
"""The GPU host run's carry (git-ignored; lab/.gpu itself holds `make gpu-runtime-bin`'s): the node set packed,
and what lab/gpu_node_run.py adds."""
# The GPU host's programs, in the packed stream's order: like programs side by side, so that LZMA2's dictionary
# finds what they share (the Go runtime, gRPC, protobuf) once.
NODESET = (
    "containerd", "ctr", "containerd-shim-runc-v2", "nvidia-container-runtime", "nvidia-ctk", "nvidia-cdi-hook",
    "runc", "pause", "hidden-gpu-host", "hidden-gpu-test-dra-plugin",
)  # fmt: skip
NODESET_FILE = "nodeset.tar.xz"


def pack_gpu_host(groups: dict[str, tuple[Path, tuple[str, ...]]], into: Path = GPU_CARRY) -> Path:
    """`groups`: every group built, name -> (its cache directory, its programs). NODESET as one tar in one xz
    stream: the x86 BCJ filter, then LZMA2 at preset 9 with a 256 MiB dictionary (it spans several binaries;
    unpacking needs that much memory). The device machine carries 64 MiB with the repository and has no `xz`:
    Python's lzma reads it there. Also `nodeset.json`: each group's version and each program's sha256. Packed
    again only when a group's cache key changed (the stamp)."""
    into.mkdir(parents=True, exist_ok=True)
    archive, stamp = into / NODESET_FILE, into / "nodeset.json"
    carried = {name: target for name, (target, binaries) in groups.items() if any(n in binaries for n in NODESET)}
    wanted = {name: str(target) for name, target in sorted(carried.items())}
    if archive.exists() and stamp.exists() and json.loads(stamp.read_text()).get("cache") == wanted:
        print(f"gpu host: packed {archive} ({archive.stat().st_size / 2**20:.1f} MiB)")
        return archive
    started = time.monotonic()
    where = {name: target / name for target in carried.values() for name in NODESET if (target / name).exists()}
    filters = [{"id": lzma.FILTER_X86}, {"id": lzma.FILTER_LZMA2, "preset": 9, "dict_size": 256 * 2**20}]
    partial = archive.with_suffix(".partial")
    with (
        lzma.open(partial, "wb", format=lzma.FORMAT_XZ, filters=filters) as xz,
        tarfile.open(fileobj=xz, mode="w") as tar,
    ):
        for name in NODESET:
            info = tar.gettarinfo(str(where[name]), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with where[name].open("rb") as handle:
                tar.addfile(info, handle)
    os.replace(partial, archive)
    versions = {name: (target / "VERSION").read_text().split()[1] for name, target in carried.items()}
    sums = {name: hashlib.sha256(where[name].read_bytes()).hexdigest() for name in NODESET}
    stamp.write_text(json.dumps({"cache": wanted, "versions": versions, "sha256": sums}, indent=1) + "\n")
    size = sum(path.stat().st_size for path in where.values())
    print(f"gpu host: packed {size / 2**20:.1f} MiB into {archive} ({archive.stat().st_size / 2**20:.1f} MiB) "
          f"in {time.monotonic() - started:.0f} s", flush=True)  # fmt: skip
    return archive
