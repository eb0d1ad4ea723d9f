"""The DRA stack the real tier's Dynamic Resource Allocation modules share (test_dra.py, test_dra_allocation.py):
its own control plane, seeded as the whole tier is (conftest.py, kwok as the nodes' kubelets), with a namespace opened
to DRA admin access and an identity for the DRA driver's kubelet plugin, the other stand-in here: its ResourceSlices
are published by the API, under an identity of their own with the ClusterRole NVIDIA's chart gives the plugin, in the
shape k8s-dra-driver-gpu v0.4.0 publishes (pool = node, devices `gpu-<minor>`, attributes `type` and `uuid`,
unqualified, so in the driver's domain). The `plane` and `stack` fixtures are module-scoped: each module that binds
them (`plane = dra_stack.plane`) starts its own plane, so neither module's claims are in the other's cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.names import NVIDIA_DRA_DRIVER, pool_class_name
from common.tokens import Token
from e2e.controlplane import ControlPlane
from offline.program import ProgramRun, run_program
from tests.real.conftest import TENANT, bind_tenants, eventually, kwok_plane, seed
from tests.real.harness import denial
from tests.support.routes import CLAIM_ROUTES, NIC_CLASS
from tests.support.stacks import CLUSTER

DRIVER_IDENTITY = "dra-driver"
POOL = "shared"
GPU_CLASS = pool_class_name(POOL)
# Two nodes of one pool; each has two exposed and two hidden GPUs, the second node's listed first in its slice.
NODES = {
    "gpu-node-01": (
        ["GPU-0e0e0e0e-0101-4101-8101-010101010101", "GPU-0e0e0e0e-0202-4202-8202-020202020202"],
        ["GPU-4d4d4d4d-0101-4101-8101-010101010101", "GPU-4d4d4d4d-0202-4202-8202-020202020202"],
    ),
    "gpu-node-02": (
        ["GPU-0e0e0e0e-0303-4303-8303-030303030303", "GPU-0e0e0e0e-0404-4404-8404-040404040404"],
        ["GPU-4d4d4d4d-0303-4303-8303-030303030303", "GPU-4d4d4d4d-0404-4404-8404-040404040404"],
    ),
}
EXPOSED = {uuid for exposed, _ in NODES.values() for uuid in exposed}
HIDDEN = {uuid for _, hidden in NODES.values() for uuid in hidden}
CLAIMS = 12  # three times the exposed GPUs, created at once
QUOTA = CLAIMS  # the quota admits every claim: the allocator alone decides
# A namespace the platform opened to DRA admin access (kubernetes v1.36.3 pkg/registry/resource/utils.go:41-75
# refuses adminAccess elsewhere): the tenant's `edit` there, and the guard the only thing judging its claims.
ADMIN_ACCESS_NS = "ml-admin"
ADMIN_ACCESS_LABEL = {"resource.kubernetes.io/admin-access": "true"}


def stack_config() -> dict[str, Any]:
    return {
        **CLUSTER,
        "hidden-gpu:nodes": [
            {"name": name, "pool": POOL, "allocator": "dra", "exposedGpus": exposed, "hiddenGpus": hidden}
            for name, (exposed, hidden) in NODES.items()
        ],
        "hidden-gpu:quotas": {TENANT: QUOTA, "ml-training": 1},
        "hidden-gpu:dra": {},
        "hidden-gpu:guard": {"allowedDeviceClasses": [NIC_CLASS]},
    }


def published(driver: str, node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    """A driver's ResourceSlice for a node, its one pool named after the node (as NVIDIA's driver names it)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def resource_slice(node: str) -> dict[str, Any]:
    """What NVIDIA's kubelet plugin publishes for a node: every GPU NVML sees, hidden ones included (it has no
    per-UUID filter: cmd/gpu-kubelet-plugin/nvlib.go), hidden first here so a first-fit allocator meets them first."""
    exposed, hidden = NODES[node]
    devices = [
        {"name": f"gpu-{minor}", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}}}
        for minor, uuid in enumerate([*hidden, *exposed])
    ]
    devices.append({"name": "nic-0", "attributes": {"type": {"string": "nic"}}})  # no uuid: never selected
    return published(NVIDIA_DRA_DRIVER, node, devices)


def nic_slice(node: str) -> dict[str, Any]:
    """A NIC driver's slice for the node: one device, for the allowed class."""
    return published(NIC_CLASS, node, [{"name": "nic-0", "attributes": {"model": {"string": "test-nic"}}}])


@pytest.fixture(scope="module")
def plane(bin_dir: Path) -> Iterator[ControlPlane]:
    with kwok_plane(bin_dir, identities={DRIVER_IDENTITY: ["hidden-gpu:dra-drivers"]}) as started:
        seed(started)
        started.apply(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ADMIN_ACCESS_NS, "labels": ADMIN_ACCESS_LABEL},
            }
        )
        bind_tenants(started, ADMIN_ACCESS_NS, "edit")
        started.request(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            {
                "metadata": {"name": "dra-driver"},
                "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["*"]}],
            },
        )
        started.request(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": "dra-driver"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "dra-driver"},
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "hidden-gpu:dra-drivers"}
                ],
            },
        )
        yield started


@pytest.fixture(scope="module")
def stack(plane: ControlPlane) -> ProgramRun:
    """The stack's objects as `up` leaves them (server-side applied), the driver's slices, and NVIDIA's own class
    (as its chart creates it) beside the stack's: tenants must not reach it."""
    run = run_program(stack_config(), "dra")
    wanted = {Token.DEVICE_CLASS, Token.ADMISSION_POLICY, Token.ADMISSION_BINDING, Token.RESOURCE_QUOTA}
    for resource in run.kubernetes_objects:
        if resource.type in wanted:
            plane.apply(resource.inputs)
    plane.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": NVIDIA_DRA_DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NVIDIA_DRA_DRIVER}'"}}]},
        }
    )
    for node in NODES:
        plane.apply(resource_slice(node), identity=DRIVER_IDENTITY, manager="dra-driver")
        plane.apply(nic_slice(node), identity=DRIVER_IDENTITY, manager="dra-driver")
    # The allowed NIC class, as its driver's chart would make it: another driver's devices.
    plane.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": NIC_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NIC_CLASS}'"}}]},
        }
    )
    probe = CLAIM_ROUTES["nvidia-gpu-class"][0]
    eventually(lambda: "hidden-gpu guard" in (denial(plane, probe) or ""), what="the claims policy in force")
    return run
