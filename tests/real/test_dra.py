"""Dynamic Resource Allocation on the real API server (issue 31): the stack's claims policy type-checks without a
warning, denies every claim route of tests/support/routes.py by its rule (in a namespace opened to admin access, so the
guard alone judges) and admits every claim tenants need; the quota caps claims from the pool's class; no hidden UUID is
in any object the stack writes; cluster.verify reads the driver's slices and the live classes; and docs/compatibility.md's
affinity keeps NVIDIA's own kubelet plugin off the node hidden-gpu labels. The DRA stack and its own control plane are
tests/real/dra_stack.py's; what the scheduler's allocator hands out is tests/real/test_dra_allocation.py's.
"""

from __future__ import annotations

import json
import re
import textwrap
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
)
from e2e.controlplane import ApiError, ControlPlane
from offline.program import ProgramRun
from tests.real import dra_stack
from tests.real.conftest import TENANT, eventually
from tests.real.dra_stack import ADMIN_ACCESS_NS, EXPOSED, GPU_CLASS, HIDDEN, NODES, stack_config
from tests.real.harness import denial, rule_in
from tests.support.routes import CLAIM_BENIGN, CLAIM_ROUTES, NIC_CLASS, claim, exactly
from tests.support.routes import GPU_CLASS as ROUTES_GPU_CLASS
from tests.support.stacks import write_stack

# The DRA stack's own control plane and objects: module-scoped fixtures, bound here.
plane = dra_stack.plane
stack = dra_stack.stack


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
