"""What the host's GPUs are and who uses them, read through NVML (nvidia-ml-py, `import pynvml`).

Host-side code: imports nothing but the standard library and common/, so it runs on a GPU server
that only has nvidia-ml-py. The NVML module is passed in, which lets tests inject a fake one.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from common.cli import UnavailableError


class NvmlUnavailableError(UnavailableError):
    """NVML cannot answer on this machine; the message says why and what to do."""


@dataclass(frozen=True)
class MigDevice:
    uuid: str


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total_bytes: int
    mig_enabled: bool
    mig_devices: list[MigDevice] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "pciBusId": self.pci_bus_id,
            "memoryTotalBytes": self.memory_total_bytes,
            "migEnabled": self.mig_enabled,
            "migDevices": [{"uuid": mig.uuid} for mig in self.mig_devices],
        }


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_gpu_memory_bytes: int | None  # None where NVML cannot tell (e.g. some MIG setups)


def load_nvml(record: Path | None = None) -> ModuleType:
    """pynvml, or with `record` a recorded host's answers (host/recorded.py: trying the tools without a GPU)."""
    if record is not None:
        from host.recorded import load_record  # noqa: PLC0415

        return load_record(record)
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise NvmlUnavailableError("nvidia-ml-py is not installed: pip install nvidia-ml-py") from None


def _text(value: str | bytes) -> str:
    # Older bindings return bytes.
    return value.decode() if isinstance(value, bytes) else value


@contextlib.contextmanager
def session(nvml: ModuleType) -> Iterator[ModuleType]:
    """nvmlInit .. nvmlShutdown, with NVML's failures turned into one clear message."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound:
        raise NvmlUnavailableError(
            "no NVIDIA driver here: libnvidia-ml.so could not be loaded; run this on the GPU host"
        ) from None
    except nvml.NVMLError_DriverNotLoaded:
        raise NvmlUnavailableError("the NVIDIA driver is installed but not loaded (nvidia-smi says more)") from None
    except nvml.NVMLError_NoPermission:
        raise NvmlUnavailableError("no permission to use NVML: run as root or a user in the video group") from None
    except nvml.NVMLError as error:
        raise NvmlUnavailableError(f"NVML failed to start: {error}") from None
    try:
        yield nvml
    except nvml.NVMLError as error:
        raise NvmlUnavailableError(f"NVML error while reading the GPUs: {error}") from None
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _mig_devices(nvml: ModuleType, handle: Any) -> tuple[bool, list[MigDevice]]:
    try:
        current_mode, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError_NotSupported:
        return False, []
    if current_mode != nvml.NVML_DEVICE_MIG_ENABLE:
        return False, []
    devices = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError_NotFound:
            continue  # an empty slot: no GPU instance was created there
        devices.append(MigDevice(_text(nvml.nvmlDeviceGetUUID(mig))))
    return True, devices


def list_gpus(nvml: ModuleType) -> list[Gpu]:
    """Every GPU NVML sees, in index order. Call inside session()."""
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        mig_enabled, mig_devices = _mig_devices(nvml, handle)
        gpus.append(
            Gpu(
                index=index,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                name=_text(nvml.nvmlDeviceGetName(handle)),
                pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
                memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                mig_enabled=mig_enabled,
                mig_devices=mig_devices,
            )
        )
    return gpus


def uuids_by_minor(nvml: ModuleType) -> dict[int, str]:
    """Each GPU's UUID by its device minor number (/dev/nvidia<minor>, and NVIDIA's DRA driver's `gpu-<minor>`);
    a GPU whose minor NVML cannot tell is left out. Call inside session()."""
    found = {}
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            found[int(nvml.nvmlDeviceGetMinorNumber(handle))] = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError:
            continue
    return found


def gpu_processes(nvml: ModuleType, index: int) -> list[GpuProcess]:
    """Compute and graphics processes on one GPU, one entry per PID. Call inside session()."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    by_pid: dict[int, GpuProcess] = {}
    for query in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
        try:
            found = query(handle)
        except nvml.NVMLError_NotSupported:
            continue
        for process in found:
            used = process.usedGpuMemory
            # NVML reports "not available" as None or as a sentinel near 2**64.
            used_bytes = int(used) if isinstance(used, int) and used < 2**63 else None
            previous = by_pid.get(process.pid)
            if previous is None or (used_bytes or 0) > (previous.used_gpu_memory_bytes or 0):
                by_pid[process.pid] = GpuProcess(process.pid, used_bytes)
    return [by_pid[pid] for pid in sorted(by_pid)]
