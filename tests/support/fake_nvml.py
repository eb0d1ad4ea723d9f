"""A stand-in for the `pynvml` module, built as a module and handed to the tools' main()."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H200"
    bus_id: str = "00000000:1B:00.0"
    memory_total: int = 150_754_820_096
    mig_uuids: list[str | None] | None = None  # None: MIG not supported; a None entry: empty slot
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)


class _Error(Exception):
    pass


def fake_nvml(gpus: list[FakeGpu], init_error: str | None = None) -> types.ModuleType:
    """init_error names an NVMLError_* class that nvmlInit raises, as on a host without a driver."""
    module = types.ModuleType("fake_pynvml")
    errors = {
        name: type(f"NVMLError_{name}", (_Error,), {})
        for name in (
            "LibraryNotFound",
            "DriverNotLoaded",
            "NoPermission",
            "NotSupported",
            "NotFound",
            "Unknown",
        )
    }
    module.NVMLError = _Error  # type: ignore[attr-defined]
    for name, cls in errors.items():
        setattr(module, f"NVMLError_{name}", cls)
    module.NVML_DEVICE_MIG_ENABLE = 1  # type: ignore[attr-defined]
    state = {"initialised": False}

    def init() -> None:
        if init_error:
            raise errors[init_error]()
        state["initialised"] = True

    def gpu(handle: Any) -> FakeGpu:
        assert state["initialised"], "NVML used before nvmlInit"
        assert isinstance(handle, FakeGpu)
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

    def uuid_of(handle: Any) -> str:
        return str(handle.uuid)

    def processes(kind: str) -> Any:
        return lambda handle: [
            types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in getattr(gpu(handle), kind)
        ]

    module.__dict__.update(
        nvmlInit=init,
        nvmlShutdown=lambda: state.update(initialised=False),
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda index: gpus[index],
        nvmlDeviceGetUUID=uuid_of,
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
