"""Dynamic Resource Allocation on the real API server and the real scheduler (issue 31): the stack's GPU DeviceClasses
hand out exposed GPUs only, under load, and the claims policy keeps tenants off every other class.

Its own control plane: the session's guard is another stack's. Its nodes' kubelets are kwok (conftest.py), as in the
whole tier; the other stand-in is the DRA driver's kubelet plugin: its ResourceSlices are published by the API, under an identity of their own with the ClusterRole NVIDIA's chart gives
the plugin, in the shape k8s-dra-driver-gpu v0.4.0 publishes (pool = node, devices `gpu-<minor>`, attributes `type`
and `uuid`, unqualified, so in the driver's domain). Everything that decides who gets a device is real: admission,
quota, and the scheduler's DRA allocator.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster import verify
from common.names import (
    CLAIMS_POLICY_NAME,
    DEVICE_PLUGIN_LABEL,
    DRA_API_PATH,
    NODE_LABEL,
    NVIDIA_DRA_DRIVER,
    dra_quota_key,
    pool_class_name,
)
from common.tokens import Token
from e2e.controlplane import ApiError, ControlPlane
from offline.program import ProgramRun, run_program
from tests.real.conftest import TENANT, bind_tenants, eventually, kwok_plane, seed
from tests.real.harness import denial, rule_in
from tests.support.routes import CLAIM_BENIGN, CLAIM_ROUTES, NIC_CLASS, claim, exactly
from tests.support.routes import GPU_CLASS as ROUTES_GPU_CLASS
from tests.support.stacks import CLUSTER, write_stack

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


def test_the_claims_policy_type_checks_without_a_warning(plane: ControlPlane, stack: ProgramRun) -> None:
    def checked() -> dict[str, Any] | None:
        policy: dict[str, Any] = plane.request(
            "GET", f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{CLAIMS_POLICY_NAME}"
        )
        status = policy.get("status", {})
        return policy if status.get("observedGeneration") == policy["metadata"]["generation"] else None

    status = eventually(checked, what="type-checked")["status"]
    assert status.get("typeChecking", {}).get("expressionWarnings") in (None, []), status


@pytest.mark.parametrize("route", CLAIM_ROUTES, ids=list(CLAIM_ROUTES))
def test_every_claim_route_is_denied_by_the_api_server(plane: ControlPlane, stack: ProgramRun, route: str) -> None:
    obj, rule = CLAIM_ROUTES[route]
    # The routes name the class of gpu-node-01 outside a pool; this stack's class is the pool's.
    message = denial(plane, retarget(obj), namespace=ADMIN_ACCESS_NS)
    assert rule_in(message) == (rule if isinstance(rule, str) else rule[0])


@pytest.mark.parametrize("name", CLAIM_BENIGN, ids=list(CLAIM_BENIGN))
def test_claims_tenants_need_are_admitted_by_the_api_server(plane: ControlPlane, stack: ProgramRun, name: str) -> None:
    assert denial(plane, retarget(CLAIM_BENIGN[name])) is None


def retarget(obj: dict[str, Any]) -> dict[str, Any]:
    """The route with tests/support/routes.py's GPU class (gpu-node-01's own) replaced by this stack's pool class."""
    return dict(json.loads(json.dumps(obj).replace(f'"{ROUTES_GPU_CLASS}"', f'"{GPU_CLASS}"')))


def claim_pod(name: str, claim_name: str) -> dict[str, Any]:
    """A tenant pod whose one container uses the named ResourceClaim."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TENANT},
        "spec": {
            "containers": [{"name": "app", "image": "busybox", "resources": {"claims": [{"name": "dev"}]}}],
            "resourceClaims": [{"name": "dev", "resourceClaimName": claim_name}],
        },
    }


def allocated(plane: ControlPlane, name: str) -> list[str] | None:
    """The UUIDs of the devices the scheduler allocated to this claim, None while unallocated."""
    found = plane.request("GET", f"{DRA_API_PATH}/namespaces/{TENANT}/resourceclaims/{name}")
    allocation = (found.get("status") or {}).get("allocation")
    if not allocation:
        return None
    uuids = {
        f"{node}/gpu-{minor}": uuid
        for node, (exposed, hidden) in NODES.items()
        for minor, uuid in enumerate([*hidden, *exposed])
    }
    results = allocation["devices"]["results"]
    return [uuids.get(f"{r['pool']}/{r['device']}", f"<{r['pool']}/{r['device']}>") for r in results]


def test_many_claims_at_once_get_exposed_gpus_only(plane: ControlPlane, stack: ProgramRun) -> None:
    """Twelve tenant pods, each with its own claim of one GPU from the pool's class, created at once: the
    scheduler's allocator gives out each exposed GPU once and no hidden one, however it orders them; the rest wait."""

    def create(index: int) -> None:
        name = f"load-{index}"
        body = claim(exactly(GPU_CLASS))
        body["metadata"] = {"name": name, "namespace": TENANT}
        plane.create(body, identity="tenant")
        plane.create(claim_pod(name, name), identity="tenant")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(CLAIMS)))

    def settled() -> dict[str, list[str] | None] | None:
        result = {f"load-{i}": allocated(plane, f"load-{i}") for i in range(CLAIMS)}
        done = sum(1 for uuids in result.values() if uuids)
        return result if done == len(EXPOSED) else None

    result = eventually(settled, seconds=90, what="every exposed GPU allocated")
    handed_out = [uuid for uuids in result.values() if uuids for uuid in uuids]
    assert sorted(handed_out) == sorted(EXPOSED), result
    assert not HIDDEN & set(handed_out)
    # The rest stay unallocated: nothing else the class selects is left.
    pods = plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods")["items"]
    bound = [p for p in pods if p["metadata"]["name"].startswith("load-") and p["spec"].get("nodeName")]
    assert len(bound) == len(EXPOSED)


def test_a_nic_claim_of_an_allowed_class_is_admitted_and_allocated(plane: ControlPlane, stack: ProgramRun) -> None:
    body = claim(exactly(NIC_CLASS))
    body["metadata"] = {"name": "nic", "namespace": TENANT}
    plane.create(body, identity="tenant")
    plane.create(claim_pod("nic-user", "nic"), identity="tenant")

    def results() -> list[dict[str, Any]] | None:
        found = plane.request("GET", f"{DRA_API_PATH}/namespaces/{TENANT}/resourceclaims/nic")
        allocation = (found.get("status") or {}).get("allocation") or {}
        return list(allocation["devices"]["results"]) if allocation else None

    (result,) = eventually(results, seconds=60, what="the NIC claim allocated")
    assert result["driver"] == NIC_CLASS and result["device"] == "nic-0"


def test_the_quota_caps_claims_from_the_gpu_class(plane: ControlPlane, stack: ProgramRun) -> None:
    """ml-training may hold one device of the class: a second claim is refused by quota admission."""
    quota = plane.request("GET", "/api/v1/namespaces/ml-training/resourcequotas/hidden-gpu-quota")
    assert quota["spec"]["hard"][dra_quota_key(GPU_CLASS)] == "1"

    def create(name: str) -> str | None:
        body = claim(exactly(GPU_CLASS))
        body["metadata"] = {"name": name, "namespace": "ml-training"}
        try:
            plane.create(body, identity="tenant")
        except ApiError as error:
            return error.message
        return None

    eventually(
        lambda: plane.request("GET", "/api/v1/namespaces/ml-training/resourcequotas/hidden-gpu-quota").get("status"),
        what="the quota counted",
    )
    assert create("first") is None
    refused = create("second")
    assert refused is not None and "exceeded quota" in refused and dra_quota_key(GPU_CLASS) in refused, refused


def test_no_hidden_uuid_is_in_any_object_the_stack_writes(stack: ProgramRun) -> None:
    text = str([r.inputs for r in stack.kubernetes_objects])
    assert not [uuid for uuid in HIDDEN if uuid in text]
    assert all(uuid in text for uuid in EXPOSED)


def test_verify_reads_the_drivers_slices_and_classes(
    plane: ControlPlane, stack: ProgramRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """cluster.verify against this API server: the stack's classes as declared, no hidden GPU a tenant class
    selects; then NVIDIA's class mapping nvidia.com/gpu through DRA (as its chart does on resource.k8s.io/v1) and an
    allowed class selecting every device are each named."""
    config = {
        **stack_config(),
        "kubernetes:kubeconfig": str(plane.kubeconfig("admin")),
        "kubernetes:context": "admin@e2e",
    }

    def dra_rows() -> dict[str, dict[str, Any]]:
        verify.main(["--stack-file", str(write_stack(tmp_path, config, "dra")), "--json", "--deadline", "30"])
        checks = json.loads(capsys.readouterr().out)["checks"]
        return {
            f"{c['scope']} {c['what']}": c
            for c in checks
            if "DeviceClass" in c["what"] or "deviceclass" in c["what"] or "ResourceSlices" in c["what"]
        }

    rows = dra_rows()
    # These slices are a stock kubelet plugin's (every GPU): each hidden one is named with its slice (issue 41).
    listed = rows["gpu-node-01 hidden GPUs in its ResourceSlices"]["actual"]
    assert all(f"{uuid} in ResourceSlice " in listed for uuid in NODES["gpu-node-01"][1]), listed
    assert rows[f"cluster DeviceClass {GPU_CLASS}"]["ok"]
    assert all(rows[f"{node} hidden GPUs a tenant DeviceClass selects"]["ok"] for node in NODES)
    assert rows[f"{TENANT} ResourceQuota {dra_quota_key(GPU_CLASS)}"]["ok"]
    plane.request(
        "PATCH",
        f"{DRA_API_PATH}/deviceclasses/{NVIDIA_DRA_DRIVER}",
        {"spec": {"extendedResourceName": "nvidia.com/gpu"}},
        content_type="application/merge-patch+json",
    )
    plane.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": NIC_CLASS}})
    try:
        rows = dra_rows()
        assert rows["cluster DeviceClasses mapping an NVIDIA resource"]["actual"] == "gpu.nvidia.com->nvidia.com/gpu"
        reached = rows["gpu-node-01 hidden GPUs a tenant DeviceClass selects"]["actual"]
        assert all(f"{uuid} by {NIC_CLASS}" in reached for uuid in NODES["gpu-node-01"][1]), reached
    finally:
        plane.request("DELETE", f"{DRA_API_PATH}/deviceclasses/{NIC_CLASS}")


def test_the_documented_affinity_keeps_nvidias_kubelet_plugin_off_stack_nodes(plane: ControlPlane) -> None:
    """docs/compatibility.md's values for NVIDIA's chart (issue 41): a DaemonSet with that affinity gets a pod on
    every GPU node but the one hidden-gpu labels (as its node patch does: the node-switches policy holds the pair),
    by the real DaemonSet controller."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "compatibility.md").read_text()
    (snippet,) = re.findall(r"```yaml\n(\s*kubeletPlugin:.*?)```", text, re.S)
    affinity = yaml.safe_load(textwrap.dedent(snippet))["kubeletPlugin"]["affinity"]
    plane.request(
        "PATCH", "/api/v1/nodes/gpu-node-01", {"metadata": {"labels": {NODE_LABEL: "gpu-node-01", DEVICE_PLUGIN_LABEL: "false"}}},
        content_type="application/merge-patch+json",
    )  # fmt: skip
    labels = {"app": "stock-dra-kubelet-plugin"}
    plane.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "stock-dra-kubelet-plugin", "namespace": "kube-system"},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"affinity": affinity, "containers": [{"name": "c", "image": "registry.example/c:1"}]},
                },
            },
        }
    )
    gpu_nodes = {
        n["metadata"]["name"]
        for n in plane.request("GET", "/api/v1/nodes?labelSelector=nvidia.com/gpu.present")["items"]
    }

    def targeted() -> set[str] | None:
        pods = plane.request("GET", "/api/v1/namespaces/kube-system/pods?labelSelector=app=stock-dra-kubelet-plugin")
        names = {
            term["matchFields"][0]["values"][0]
            for pod in pods["items"]
            for term in pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"
            ]
        }
        return names if names == gpu_nodes - {"gpu-node-01"} else None

    try:
        eventually(targeted, what="a stock plugin pod on every GPU node but gpu-node-01")
    finally:
        plane.request("DELETE", "/apis/apps/v1/namespaces/kube-system/daemonsets/stock-dra-kubelet-plugin")


def test_a_claim_left_from_warn_is_never_allocated(plane: ControlPlane, stack: ProgramRun) -> None:
    """issue 40, 1: a claim of NVIDIA's class made while the guard only warned; in enforce, a pod naming it is
    admitted (the pod policy cannot read the claim's class), but the real scheduler's status write that would
    allocate it a GPU is denied by the claim rules: the claim stays unallocated, the pod unscheduled."""
    binding = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{CLAIMS_POLICY_NAME}"

    def actions(value: list[str]) -> None:
        plane.request(
            "PATCH", binding, {"spec": {"validationActions": value}}, content_type="application/merge-patch+json"
        )

    left = claim(exactly(NVIDIA_DRA_DRIVER))
    left["metadata"] = {"name": "left-from-warn", "namespace": TENANT}
    probe = CLAIM_ROUTES["nvidia-gpu-class"][0]
    actions(["Warn"])
    try:
        eventually(lambda: plane.create(left, identity="tenant"), what="the claim admitted while the guard warns")
    finally:
        actions(["Deny"])
    eventually(lambda: "hidden-gpu guard" in (denial(plane, probe) or ""), what="the claims policy denying again")
    scheduler_log_from = len(plane.log("kube-scheduler"))
    plane.create(claim_pod("left-from-warn", "left-from-warn"), identity="tenant")
    refused = "hidden-gpu guard, rule claim-device-classes"
    eventually(
        lambda: refused in plane.log("kube-scheduler")[scheduler_log_from:],
        seconds=60,
        what="the scheduler's allocation of the claim refused",
    )
    assert allocated(plane, "left-from-warn") is None
    assert not plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods/left-from-warn")["spec"].get("nodeName")
