"""What the kubelet says about a node's devices: which it can allocate, and to which pod and container.

Read over the kubelet's PodResources socket (gRPC, unix socket), as NVIDIA's dcgm-exporter does to
label its metrics with pods. Device IDs are GPU or MIG UUIDs with the pinned plugin's
DEVICE_ID_STRATEGY=uuid; a time-sliced replica is `<uuid>::<n>` and counts as its GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from common.cli import UnavailableError
from common.names import NVIDIA_RESOURCE_PATTERN
from host.podresources import api_pb2, api_pb2_grpc

NVIDIA_RESOURCE = re.compile(NVIDIA_RESOURCE_PATTERN)
REPLICA_SUFFIX = "::"
TIMEOUT_SECONDS = 5.0


class SocketAbsentError(UnavailableError):
    """No kubelet socket at the path: not a Kubernetes node, or the path is wrong."""


def device_uuid(device_id: str) -> str:
    """The GPU or MIG UUID a device ID stands for: a time-sliced replica is `<uuid>::<n>`."""
    return device_id.split(REPLICA_SUFFIX, 1)[0]


@dataclass(frozen=True)
class Holder:
    """A container the kubelet allocated a device to."""

    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"pod {self.namespace}/{self.pod} container {self.container}"


@dataclass(frozen=True)
class DraDevice:
    """A device the kubelet handed a container through a DRA claim, named as its driver's ResourceSlice names it."""

    holder: Holder
    claim: str  # namespace/name
    driver: str
    pool: str
    device: str


@dataclass
class NodeDevices:
    """The kubelet's view: allocatable NVIDIA device UUIDs, who holds which, and DRA devices by driver name."""

    allocatable: set[str] = field(default_factory=set)
    holders: dict[str, list[Holder]] = field(default_factory=dict)
    dra: list[DraDevice] = field(default_factory=list)

    def allocated_to(self, namespace: str, pod: str) -> set[str]:
        return {
            uuid
            for uuid, holders in self.holders.items()
            if any(h.namespace == namespace and h.pod == pod for h in holders)
        }


def read(socket_path: Path, timeout: float = TIMEOUT_SECONDS) -> NodeDevices:
    """Ask the kubelet; UnavailableError (SocketAbsentError when there is no socket) if it cannot answer."""
    if not socket_path.exists():
        raise SocketAbsentError(f"no kubelet PodResources socket at {socket_path}")
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        lister = api_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        try:
            allocatable = lister.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=timeout)
            pods = lister.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else None
            raise UnavailableError(f"the kubelet's PodResources API at {socket_path} failed: {code}") from None
    devices = NodeDevices()
    for entry in allocatable.devices:
        if NVIDIA_RESOURCE.fullmatch(entry.resource_name):
            devices.allocatable |= {device_uuid(d) for d in entry.device_ids}
    for pod in pods.pod_resources:
        for container in pod.containers:
            holder = Holder(pod.namespace, pod.name, container.name)
            for entry in container.devices:
                if NVIDIA_RESOURCE.fullmatch(entry.resource_name):
                    for device_id in entry.device_ids:
                        devices.holders.setdefault(device_uuid(device_id), []).append(holder)
            for dynamic in container.dynamic_resources:
                claim = f"{dynamic.claim_namespace}/{dynamic.claim_name}"
                devices.dra += [
                    DraDevice(holder, claim, r.driver_name, r.pool_name, r.device_name) for r in dynamic.claim_resources
                ]
    return devices
