"""The node tier's one stand-in for a GPU: a synthetic CDI spec whose devices inject markers a container can print
(a variable per GPU, its minor number, a file under /run/hidden-gpu-test/gpus), and the two settings of NVIDIA's
container runtime that decide which requests it honours."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER_DIR = "/run/hidden-gpu-test/gpus"  # e2e/go/node/internal/marker

MARKER_ENV = "HIDDEN_GPU_TEST_GPU_"

# Per injected GPU, its minor number (its place in the node's list), as NVML would tell it: the stand-in DRA plugin
# names its devices gpu-<minor> by it, as NVIDIA's does.
MINOR_ENV = "HIDDEN_GPU_TEST_MINOR_"

CDI_KIND = "nvidia.com/gpu"


@dataclass(frozen=True)
class Toolkit:
    """The two settings of NVIDIA's container runtime that decide which requests it honours; the defaults are
    the toolkit's own (api/config/v1/toml.go:255-256 of nvidia-container-toolkit v1.20.0)."""

    envvar_when_unprivileged: bool = True
    volume_mounts: bool = False


DEFAULTS = Toolkit()
HARDENED = Toolkit(envvar_when_unprivileged=False, volume_mounts=True)


def marker_env(uuid: str, prefix: str = MARKER_ENV) -> str:
    return prefix + re.sub(r"[^A-Za-z0-9]", "_", uuid).upper()


def cdi_spec(uuids: list[str], marker_files: Path) -> dict[str, Any]:
    """The synthetic CDI spec: one device per UUID, per index (the place in `uuids`, as NVML orders a host's GPUs)
    and `all`, each injecting its GPUs' markers: the names `nvidia-ctk cdi generate` gives (the GPU host run's spec:
    `0`, the UUID, `all`)."""

    def edits(of: list[str]) -> dict[str, Any]:
        return {
            "env": [f"{marker_env(u)}={u}" for u in of] + [f"{marker_env(u, MINOR_ENV)}={uuids.index(u)}" for u in of],
            "mounts": [
                {"hostPath": str(marker_files / u), "containerPath": f"{MARKER_DIR}/{u}",
                 "options": ["ro", "nosuid", "nodev", "bind"]}
                for u in of
            ],
        }  # fmt: skip

    devices = [{"name": u, "containerEdits": edits([u])} for u in uuids]
    devices += [{"name": str(index), "containerEdits": edits([u])} for index, u in enumerate(uuids)]
    devices.append({"name": "all", "containerEdits": edits(uuids)})
    return {"cdiVersion": "0.6.0", "kind": CDI_KIND, "devices": devices}
