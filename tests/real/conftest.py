"""The real tier's fixtures: a control plane built from Go modules (python -m e2e.build), started once per
session on loopback, with the cluster a stack expects around it: GPU nodes with NVIDIA capacity,
tenant namespaces, a tenant identity with `edit` there only, and the GPU Operator's namespace and
ClusterPolicy kind."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from common.names import OPERATOR_NAMESPACE
from e2e.build import GROUPS, LINKS
from e2e.controlplane import ControlPlane, NotReachedError, poll

TENANT = "ml-team"
TENANT_NAMESPACES = (TENANT, "ml-training", "ml-inference")
GPU_NODES = {"gpu-node-01": 8, "gpu-node-02": 8}
# Every binary e2e.build links for the tier (not the GPU host check's).
REQUIRED = tuple(name for group in GROUPS if not group.gpu_host for name in group.binaries)


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    return linked(REQUIRED)


@contextmanager
def seeded_plane(bin_dir: Path) -> Iterator[ControlPlane]:
    """A control plane started and seeded with what a GPU cluster has before hidden-gpu."""
    with ControlPlane.start(bin_dir) as started:
        seed(started)
        yield started


@pytest.fixture(scope="session")
def plane(bin_dir: Path) -> Iterator[ControlPlane]:
    with seeded_plane(bin_dir) as started:
        yield started


def node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "nvidia.com/gpu.present": "true"},
        },
    }


def node_status(gpus: int) -> dict[str, Any]:
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fixture"}],
        }
    }


def seed(plane: ControlPlane) -> None:
    """What a GPU cluster has before hidden-gpu: GPU nodes (Ready, with the operator's plugin's capacity),
    namespaces, the tenant's `edit` role in its own namespaces, and a ClusterPolicy kind."""
    for name, gpus in GPU_NODES.items():
        add_gpu_node(plane, name, gpus)
    for namespace in (*TENANT_NAMESPACES, OPERATOR_NAMESPACE):
        plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    for namespace in TENANT_NAMESPACES:
        bind_tenants(plane, namespace, "edit")
    # `edit` does not grant kubectl debug (this API server says so); platforms that allow it add this.
    plane.request(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {
            "metadata": {"name": "debug-pods"},
            "rules": [{"apiGroups": [""], "resources": ["pods/ephemeralcontainers"], "verbs": ["update", "patch"]}],
        },
    )
    bind_tenants(plane, TENANT, "debug-pods")
    # The GPU Operator's ClusterPolicy kind. Its own CRD could not be had here (the module proxy refuses
    # github.com/NVIDIA/gpu-operator@v26.7.0), so this one keeps the group, version, kind and scope and no schema.
    plane.request(
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        {
            "metadata": {"name": "clusterpolicies.nvidia.com"},
            "spec": {
                "group": "nvidia.com",
                "scope": "Cluster",
                "names": {"plural": "clusterpolicies", "singular": "clusterpolicy", "kind": "ClusterPolicy"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                    }
                ],
            },
        },
    )


def add_gpu_node(plane: ControlPlane, name: str, gpus: int) -> None:
    """A Ready node with the operator's plugin's capacity, as its kubelet would register it."""
    plane.request("POST", "/api/v1/nodes", node(name))
    set_node_status(plane, name, gpus)
    # The API server taints a new node not-ready; the node lifecycle controller (not run here: without
    # kubelet heartbeats it would evict everything) lifts the taint once the node reports Ready.
    plane.request(
        "PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}}, content_type="application/merge-patch+json"
    )


def bind_tenants(plane: ControlPlane, namespace: str, cluster_role: str) -> None:
    plane.request(
        "POST",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "metadata": {"name": f"tenants-{cluster_role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "hidden-gpu:tenants"}],
        },
    )


def set_node_status(plane: ControlPlane, name: str, gpus: int) -> None:
    plane.request(
        "PATCH", f"/api/v1/nodes/{name}/status", node_status(gpus), content_type="application/merge-patch+json"
    )


def eventually(check: Callable[[], Any], seconds: float = 30.0, what: str = "condition") -> Any:
    """The check's first truthy result, polling; fails the test with the last error or result after `seconds`."""
    try:
        return poll(check, seconds, what)
    except NotReachedError as error:
        pytest.fail(str(error))


def linked(required: Iterable[str]) -> Path:
    """e2e/.bin, once every binary a tier needs is linked there."""
    missing = [name for name in required if not (LINKS / name).exists()]
    if missing:
        pytest.fail(f"no {', '.join(missing)} in {LINKS}: build them first with python -m e2e.build (make e2e does)")
    return LINKS
