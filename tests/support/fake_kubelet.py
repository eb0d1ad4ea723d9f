"""The kubelet's PodResources service on a real unix socket, answering fixture allocations through the
same generated stubs the audit uses."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from host.podresources import api_pb2, api_pb2_grpc


@dataclass
class Kubelet:
    """allocatable: resource -> device IDs; pods: (namespace, pod) -> container -> resource -> device IDs;
    claims: (namespace, pod) -> container -> [(claim name, driver, pool, device)] allocated through DRA."""

    allocatable: dict[str, list[str]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = field(default_factory=dict)
    claims: dict[tuple[str, str], dict[str, list[tuple[str, str, str, str]]]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, state: Kubelet) -> None:
        self.state = state

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        self.state.calls.append("GetAllocatableResources")
        devices = [
            api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in self.state.allocatable.items()
        ]
        return api_pb2.AllocatableResourcesResponse(devices=devices)

    def List(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        self.state.calls.append("List")
        pods = [
            api_pb2.PodResources(
                name=pod,
                namespace=namespace,
                containers=[
                    api_pb2.ContainerResources(
                        name=container,
                        devices=[
                            api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices.items()
                        ],
                        dynamic_resources=[
                            api_pb2.DynamicResource(
                                claim_name=claim,
                                claim_namespace=namespace,
                                claim_resources=[
                                    api_pb2.ClaimResource(driver_name=driver, pool_name=pool, device_name=device)
                                ],
                            )
                            for claim, driver, pool, device in self.state.claims.get((namespace, pod), {}).get(
                                container, []
                            )
                        ],
                    )
                    for container, devices in containers.items()
                ],
            )
            for (namespace, pod), containers in self.state.pods.items()
        ]
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)


@contextmanager
def serve(socket_path: Path, state: Kubelet) -> Iterator[Path]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Servicer(state), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    try:
        yield socket_path
    finally:
        server.stop(grace=None).wait()
