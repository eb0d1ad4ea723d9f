"""The tests' hosts: host.recorded's NVML stand-in, under the names the tests use."""

from host.recorded import RecordedGpu as FakeGpu
from host.recorded import recorded_nvml as fake_nvml

__all__ = ["FakeGpu", "fake_nvml"]
