"""The real tier's fixtures: a control plane built from Go modules (python -m e2e.build), started once per
session on loopback, with the cluster a stack expects around it: GPU nodes with NVIDIA capacity,
tenant namespaces, a tenant identity with `edit` there only, and the GPU Operator's namespace and
CRDs (its controller runs where a test starts it: tests/real/test_gpu_operator.py).

The nodes' kubelets are kwok's controller (sigs.k8s.io/kwok, e2e.build's `kwok` group), the stand-in: it
reports each node Ready and heartbeats it, runs the pods bound there (Running, Ready) and completes their
deletion. It runs no device plugin: a node's nvidia.com/gpu is what the test registers it with. A real
kubelet is the node tier's (tests/node); here there are up to a hundred nodes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.names import OPERATOR_NAMESPACE
from e2e import gpu_operator
from e2e.build import GROUPS, LINKS, MODULES, go
from e2e.controlplane import ControlPlane, NotReachedError, poll

TENANT = "ml-team"
TENANT_NAMESPACES = (TENANT, "ml-training", "ml-inference")
GPU_NODES = {"gpu-node-01": 8, "gpu-node-02": 8}
# Every binary e2e.build links for the tier (not the GPU host check's).
REQUIRED = tuple(name for group in GROUPS if not group.gpu_host for name in group.binaries)
# kwok manages only the nodes that carry this annotation (the selector its own docs use).
KWOK_ANNOTATION, KWOK_NODE = "kwok.x-k8s.io/node", "fake"
KWOK_IDENTITY = "kwok-controller"
# The stages kwokctl gives a cluster by default (kwok v0.8.0 pkg/kwokctl/runtime/cluster.go:297-339; the node lease
# as a kubelet holds one): node-initialize reports the node Ready and keeps the capacity and allocatable it was
# registered with (kustomize/stage/node/fast/node-initialize.yaml:61-76); the heartbeat renews the lease and
# rewrites conditions and addresses, never resources; pod-ready makes a bound pod Running and Ready, pod-complete
# ends a Job's, pod-delete removes a pod being deleted (a kubelet does once its containers stopped). kwok has none
# built in: without a stage it exits (pkg/kwok/cmd/root.go:155-181).
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    return linked(REQUIRED)


@contextmanager
def seeded_plane(bin_dir: Path) -> Iterator[ControlPlane]:
    """A control plane started, with kwok as its nodes' kubelets, and seeded with what a GPU cluster has before
    hidden-gpu."""
    with kwok_plane(bin_dir) as started:
        seed(started)
        yield started


@contextmanager
def kwok_plane(bin_dir: Path, identities: dict[str, list[str]] | None = None) -> Iterator[ControlPlane]:
    """A control plane (with these token identities besides) whose nodes' kubelets are kwok."""
    with ControlPlane.start(bin_dir, identities={KWOK_IDENTITY: [], **(identities or {})}) as started:
        start_kwok(started)
        yield started


def kwok_module() -> Path:
    """kwok's module, the version e2e/go/kwok pins, from Go's module cache (downloaded if missing)."""
    return Path(json.loads(go("mod", "download", "-json", "sigs.k8s.io/kwok", cwd=MODULES / "kwok"))["Dir"])


def start_kwok(plane: ControlPlane) -> None:
    """kwok's controller as a process of the plane, its output in the plane's kwok.log (failures show it), under
    an identity bound to the ClusterRole kwok's own manifests give it (kustomize/rbac/role.yaml), with the
    default stages (KWOK_STAGES) as its only configuration."""
    module = kwok_module()
    role = yaml.safe_load((module / "kustomize/rbac/role.yaml").read_text())
    plane.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    plane.request(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": KWOK_IDENTITY},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role["metadata"]["name"],
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KWOK_IDENTITY}],
        },
    )
    config = plane.root / "kwok.yaml"
    config.write_text("---\n".join((module / "kustomize/stage" / stage).read_text() for stage in KWOK_STAGES))
    # Flags of kwok v0.8.0 (pkg/kwok/cmd/root.go:89-90, 96, 99; --config: pkg/config/flags.go:36). HOME is the
    # plane's: kwok would also load ~/.kwok/kwok.yaml where one exists (pkg/config/flags.go:82-89).
    plane.spawn(
        "kwok",
        LINKS / "kwok",
        f"--config={config}",
        f"--kubeconfig={plane.kubeconfig(KWOK_IDENTITY)}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={KWOK_NODE}",
        "--node-lease-duration-seconds=40",
        env={**os.environ, "HOME": str(plane.root)},
    )


def kwok_log(plane: ControlPlane, chars: int = 4000) -> str:
    return plane.log("kwok")[-chars:]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test of this tier shows the end of its plane's kwok log."""
    report = yield
    plane = getattr(item, "funcargs", {}).get("plane")
    if report.failed and isinstance(plane, ControlPlane) and "kwok" in plane.processes:
        report.sections.append(("kwok log (its end)", kwok_log(plane)))
    return report


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
            "annotations": {KWOK_ANNOTATION: KWOK_NODE},
            # As NFD and the GPU Operator label a GPU node: the operator resets a node without NFD's labels
            # (tests/real/test_gpu_operator.py runs it here).
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                **gpu_operator.NFD_LABELS,
                "nvidia.com/gpu.present": "true",
            },
        },
    }


def node_status(gpus: int) -> dict[str, Any]:
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    info = {"containerRuntimeVersion": gpu_operator.CONTAINER_RUNTIME}
    return {"status": {"capacity": resources, "allocatable": resources, "nodeInfo": info}}


def seed(plane: ControlPlane) -> None:
    """What a GPU cluster has before hidden-gpu: GPU nodes (Ready, with the operator's plugin's capacity),
    namespaces, the tenant's `edit` role in its own namespaces, and the GPU Operator's CRDs."""
    add_gpu_nodes(plane, GPU_NODES)
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
    # The GPU Operator's own CRDs (ClusterPolicy, NVIDIADriver), from the module e2e/go/gpuoperator pins.
    for crd in gpu_operator.crds(gpu_operator.module_dir()):
        plane.apply(crd)


def add_gpu_node(plane: ControlPlane, name: str, gpus: int) -> None:
    add_gpu_nodes(plane, {name: gpus})


def add_gpu_nodes(plane: ControlPlane, gpus: dict[str, int]) -> None:
    """Nodes as their kubelets register them, each with its nvidia.com/gpu (name -> count: what a device plugin
    there advertises, as the test says), then handed to kwok, which reports them Ready."""
    assert "kwok" in plane.processes, "a plane without kwok: start it with kwok_plane() or seeded_plane()"
    for name, count in gpus.items():
        # One create with its status, as a kubelet registers its node (the API server keeps a new node's status:
        # k8s.io/kubernetes v1.36.3 pkg/registry/core/node/strategy.go:80-83), and with kwok's annotation from the
        # start: kwok v0.8.0 takes the lease only of a node it sees added, not modified (pkg/kwok/controllers/
        # node_controller.go:211), and leaves a node whose lease it does not hold alone (controller.go:288-291):
        # a node annotated after its creation was never reported Ready here.
        plane.request("POST", "/api/v1/nodes", {**node(name), **node_status(count)})
        # The API server taints a new node not-ready; the node lifecycle controller (not run here) lifts the taint
        # once the node reports Ready: the fixture does.
        plane.request(
            "PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}}, content_type="application/merge-patch+json"
        )

    def ready() -> bool:
        nodes = plane.request("GET", "/api/v1/nodes")["items"]
        up = {
            n["metadata"]["name"]
            for n in nodes
            if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
        }
        return set(gpus) <= up

    try:
        poll(ready, 60, f"kwok reporting {len(gpus)} node(s) Ready", interval=0.1)
    except NotReachedError as error:
        pytest.fail(f"{error}\nkwok log:\n{kwok_log(plane)}")


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
