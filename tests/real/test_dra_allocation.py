"""The real scheduler's DRA allocator on the stack's pool class (issue 31), the driver's slices listing hidden GPUs
first: twelve tenant claims created at once get the four exposed GPUs, each once, and no hidden one, the rest
waiting; a NIC claim of the allowed class is admitted and allocated from the NIC driver's slice; and a claim of
NVIDIA's class made while the guard only warned is never allocated once it enforces, because the scheduler's status
write that would allocate it is denied by the claim rules (issue 40). The DRA stack and its own control plane are
tests/real/dra_stack.py's.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

from common.names import CLAIMS_POLICY_NAME, DRA_API_PATH, NVIDIA_DRA_DRIVER, POOL_LABEL
from common.tokens import Token
from e2e.controlplane import ControlPlane
from offline.program import ProgramRun
from tests.real import dra_stack
from tests.real.conftest import TENANT, eventually
from tests.real.dra_stack import CLAIMS, EXPOSED, GPU_CLASS, HIDDEN, NODES, POOL
from tests.real.harness import denial
from tests.support.routes import CLAIM_ROUTES, NIC_CLASS, claim, exactly

# The DRA stack's own control plane and objects: module-scoped fixtures, bound here.
plane = dra_stack.plane
stack = dra_stack.stack


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


def test_a_plain_gpu_pod_through_a_mapped_class_waits_on_the_claim_rule(plane: ControlPlane, stack: ProgramRun) -> None:
    """docs/security.md: NVIDIA's chart sets `extendedResourceName: nvidia.com/gpu` on its class, and the scheduler
    then places a plain `nvidia.com/gpu` pod through DRA from every GPU the class selects, hidden ones included. The
    pod is admitted (it asks for nvidia.com/gpu under the pool's RuntimeClass, as a tenant should); the claim the
    scheduler creates for it in the tenant's namespace names NVIDIA's class and is denied by the claims policy, so
    the pod stays unbound and no claim of it exists."""
    (runtime_class,) = [
        r.inputs for r in stack.of_type(Token.RUNTIME_CLASS) if r.inputs["metadata"]["name"] == GPU_CLASS
    ]
    plane.apply(runtime_class)
    # As the node's kubelet shows it with DRA serving its GPUs: the pool's label, and no device plugin's resource.
    for node in NODES:
        plane.request("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": {POOL_LABEL: POOL}}},
                      content_type="application/merge-patch+json")  # fmt: skip
        none = {"nvidia.com/gpu": "0"}
        plane.request("PATCH", f"/api/v1/nodes/{node}/status", {"status": {"capacity": none, "allocatable": none}},
                      content_type="application/merge-patch+json")  # fmt: skip
    mapped = {"spec": {"extendedResourceName": "nvidia.com/gpu"}}
    plane.request("PATCH", f"{DRA_API_PATH}/deviceclasses/{NVIDIA_DRA_DRIVER}", mapped,
                  content_type="application/merge-patch+json")  # fmt: skip
    container = {"name": "app", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mapped-gpu", "namespace": TENANT},
           "spec": {"runtimeClassName": GPU_CLASS, "containers": [container]}}  # fmt: skip
    plane.create(pod)
    path = f"/api/v1/namespaces/{TENANT}/pods/mapped-gpu"
    try:

        def refused() -> str:
            found = plane.request("GET", path)
            assert not found["spec"].get("nodeName"), found["spec"]["nodeName"]
            conditions = {c["type"]: c for c in (found.get("status") or {}).get("conditions") or []}
            return str(conditions.get("PodScheduled", {}).get("message", ""))

        message = eventually(lambda: (m := refused()) and CLAIMS_POLICY_NAME in m and m, what="the claim refused")
        assert "create claim for extended resources" in message and "claim-device-classes" in message, message
        claims = plane.request("GET", f"{DRA_API_PATH}/namespaces/{TENANT}/resourceclaims")["items"]
        assert not [c for c in claims if c["metadata"].get("ownerReferences", [{}])[0].get("name") == "mapped-gpu"]
    finally:
        plane.request("DELETE", path)
