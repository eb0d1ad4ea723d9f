"""A recorded host: NVML's answers from a JSON file, so discover and audit can be tried without a GPU.

    python -m host.discover --record examples/host-record.json
    python -m host.audit --stack dev --node dgx-dev-01 --record examples/host-record.json

The file is what `discover --json` prints on a real host (a list of GPUs: uuid, name, pciBusId,
memoryTotalBytes, migEnabled, migDevices), optionally with `processes` per GPU ({pid,
usedGpuMemoryBytes}). It stands in for the `pynvml` module the tools otherwise load: what they do with
the answers is the same code. The tests build their hosts with it too.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.cli import FileRefusedError, UsageError, bounded, read_regular_file

# A real host's record is a few KB: a bound on what a wrong file (a disk image, /dev/zero) can cost.
MAX_RECORD_BYTES = 16 << 20


@dataclass
class RecordedGpu:
    uuid: str
    name: str = "NVIDIA H200"
    bus_id: str = "00000000:1B:00.0"
    memory_total: int = 150_754_820_096
    mig_uuids: list[str | None] | None = None  # None: MIG not supported; a None entry: empty slot
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    minor: int | None = None  # the device minor number; None: its index, as on most hosts


class _Error(Exception):
    pass


_ERRORS = ("LibraryNotFound", "DriverNotLoaded", "NoPermission", "NotSupported", "NotFound", "Unknown")


def recorded_nvml(gpus: list[RecordedGpu], init_error: str | None = None) -> types.ModuleType:
    """A module with pynvml's names answering from `gpus`; init_error names an NVMLError_* class that
    nvmlInit raises, as on a host without a driver."""
    module = types.ModuleType("recorded_pynvml")
    errors = {name: type(f"NVMLError_{name}", (_Error,), {}) for name in _ERRORS}
    module.NVMLError = _Error  # type: ignore[attr-defined]
    for name, cls in errors.items():
        setattr(module, f"NVMLError_{name}", cls)
    module.NVML_DEVICE_MIG_ENABLE = 1  # type: ignore[attr-defined]
    state = {"initialised": False}

    def init() -> None:
        if init_error:
            raise errors[init_error]()
        state["initialised"] = True

    def gpu(handle: Any) -> RecordedGpu:
        assert state["initialised"], "NVML used before nvmlInit"
        assert isinstance(handle, RecordedGpu)
        return handle

    def mig_mode(handle: Any) -> tuple[int, int]:
        if gpu(handle).mig_uuids is None:
            raise errors["NotSupported"]()
        return (1, 1) if gpu(handle).mig_uuids else (0, 0)

    def mig_handle(handle: Any, slot: int) -> Any:
        uuid = (gpu(handle).mig_uuids or [])[slot]
        if uuid is None:
            raise errors["NotFound"]()
        return types.SimpleNamespace(uuid=uuid)

    def processes(kind: str) -> Any:
        return lambda handle: [
            types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in getattr(gpu(handle), kind)
        ]

    module.__dict__.update(
        nvmlInit=init,
        nvmlShutdown=lambda: state.update(initialised=False),
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda index: gpus[index],
        nvmlDeviceGetUUID=lambda handle: str(handle.uuid),
        nvmlDeviceGetMinorNumber=lambda handle: gpus.index(gpu(handle)) if handle.minor is None else handle.minor,
        nvmlDeviceGetName=lambda handle: gpu(handle).name,
        nvmlDeviceGetPciInfo=lambda handle: types.SimpleNamespace(busId=gpu(handle).bus_id.encode()),
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(total=gpu(handle).memory_total),
        nvmlDeviceGetMigMode=mig_mode,
        nvmlDeviceGetMaxMigDeviceCount=lambda handle: len(gpu(handle).mig_uuids or []),
        nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        nvmlDeviceGetComputeRunningProcesses=processes("compute"),
        nvmlDeviceGetGraphicsRunningProcesses=processes("graphics"),
    )
    return module


def load_record(path: Path) -> types.ModuleType:
    """The NVML stand-in for a record file, or UsageError naming the file and what is wrong."""
    try:
        entries = json.loads(read_regular_file(path, MAX_RECORD_BYTES, "host record"))
        gpus = [
            RecordedGpu(
                uuid=str(entry["uuid"]),
                name=str(entry.get("name", "NVIDIA GPU")),
                bus_id=str(entry.get("pciBusId", f"00000000:{index:02X}:00.0")),
                memory_total=int(entry.get("memoryTotalBytes", 0)),
                mig_uuids=[str(m["uuid"]) for m in entry.get("migDevices", [])] if entry.get("migEnabled") else None,
                compute=[(int(p["pid"]), p.get("usedGpuMemoryBytes")) for p in entry.get("processes", [])],
            )
            for index, entry in enumerate(entries)
        ]
    except FileRefusedError as error:
        raise UsageError(f"--record {path}: {error.reason}") from None
    except RecursionError:
        raise UsageError(f"--record {path}: nested too deeply: not a host record") from None
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as error:
        raise UsageError(
            f"--record {path}: not a host record (a JSON list of GPUs as discover --json prints): {bounded(str(error))}"
        ) from None
    return recorded_nvml(gpus)
