"""The guard on every other minor a platform may run (issue 40): kube-apiserver 1.35, 1.36 and 1.38 (e2e.build's
`k8s1xx` groups: the newest patch of each the module proxy serves), beside the tier's etcd and nothing else;
1.37, the tier's own, is tests/real/test_admission.py's. Admission is the subject: no scheduler, no kubelet, and
no controller manager: each API server compiles every expression when the policy is created (and refuses one it
cannot), and that minor's own type checker (the controller manager's, built alone: e2e/go/typecheck) reads each
policy's expressions against the schemas the server serves.

On each: every policy is accepted; every pod, ConfigMap/Secret and claim route of tests/support/routes.py is denied
by its rule and every benign object admitted (the tenant's dry-run creates); every object the every-component stack
renders passes the version's schema (a strict dry-run apply)."""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.names import OPERATOR_NAMESPACE
from common.tokens import Token
from e2e.controlplane import ApiError, ControlPlane
from offline import render
from tests.real.conftest import TENANT, TENANT_NAMESPACES, bind_tenants, eventually
from tests.real.harness import CLASSES, apply_guard, denial, rule_in, with_namespace
from tests.support.routes import BENIGN, CLAIM_BENIGN, CLAIM_ROUTES, CLAIMS_GUARD, ROUTES
from tests.support.stacks import changed, dra_allocated

KEYED_CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "g"}, "data": {"NVIDIA_GDS": "on"}}
ADMIN_NS, ADMIN_LABEL = "ml-admin", {"resource.kubernetes.io/admin-access": "true"}
# Routes whose field a minor does not serve: its API server drops the field before admission (a disabled feature
# gate's fields are cleared on create), so the route is admitted without it. minor -> route -> the dropped field.
# DRADeviceTaints is alpha, off by default, in 1.35 (beta and on from 1.36): claims' device tolerations go.
DROPPED = {"1.35": {"claim tolerates-device-taints": '"tolerations"', "claim alternative-tolerates": '"tolerations"'}}
# The minor -> the version its binaries must report (e2e/go/k8s1xx/go.mod).
MINORS = {"1.35": "v1.35.4", "1.36": "v1.36.3", "1.38": "v1.38.0-beta.0"}
# The guard of tests/real/test_admission.py's routes and of the claim routes at once: a gVisor class declared
# plain, a NIC class tenants may claim, and gpu-node-01's GPUs handed out by DRA (its class is the routes' GPU_CLASS).
GUARD = dra_allocated(
    changed(lambda c: c.__setitem__("hidden-gpu:guard", {"plainRuntimeClasses": ["gvisor"], **CLAIMS_GUARD}))
)
EVERY = Path(__file__).resolve().parents[1] / "golden" / "Pulumi.every.yaml"
# What the schema check leaves out: the ClusterPolicy patch, whose schema is the GPU Operator's CRD, not Kubernetes'.
OPERATOR_GROUP = "nvidia.com/"
# A policy the type checker must warn of (a field no container has), so that its silence on the guard means something.
CANARY: dict[str, Any] = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": "typecheck-canary"},
    "spec": {
        "matchConstraints": {
            "resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
            ]
        },
        "validations": [{"expression": "object.spec.containers.all(c, c.notAField == 1)"}],
    },
}


@pytest.fixture(scope="module", params=list(MINORS))
def minor(request: pytest.FixtureRequest, bin_dir: Path) -> Iterator[tuple[str, ControlPlane]]:
    """A plane of that minor, its namespaces and the tenant's `edit` role as the tier seeds them, the routes'
    RuntimeClasses, and GUARD in force."""
    with ControlPlane.start(bin_dir, minor=request.param) as plane:
        for namespace in (*TENANT_NAMESPACES, OPERATOR_NAMESPACE):
            plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        # Where the API server allows DRA admin access at all (the claim routes ask for it), as tests/real/test_dra.py.
        plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ADMIN_NS, "labels": ADMIN_LABEL}})
        # `edit` is aggregated by the controller manager's clusterrole-aggregation controller, which does not run
        # here: the tenant gets what `edit` grants of the objects routes.py makes, by a role of its own.
        plane.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "tenant-objects"},
                "rules": [
                    {"apiGroups": [""], "resources": ["pods", "configmaps", "secrets"], "verbs": ["*"]},
                    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates"],
                     "verbs": ["*"]},
                ],
            }
        )  # fmt: skip
        for namespace in (*TENANT_NAMESPACES, ADMIN_NS):
            bind_tenants(plane, namespace, "tenant-objects")
            # What the controller manager's ServiceAccount controller would make: the ServiceAccount admission
            # plugin refuses a pod whose account does not exist.
            account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
            plane.apply({**account, "metadata": {"name": "default", "namespace": namespace}})
        for name, handler in CLASSES.items():
            plane.apply(
                {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": handler}
            )
        run = apply_guard(plane, GUARD)
        for resource in run.kubernetes_objects:
            if resource.type == Token.DEVICE_CLASS:
                plane.apply(resource.inputs)
        # apply_guard waited for the pod policy alone; each policy's binding reaches the plugin on its own.
        for probe, namespace in ((CLAIM_ROUTES["nvidia-gpu-class"][0], ADMIN_NS), (KEYED_CONFIGMAP, TENANT)):
            eventually(
                functools.partial(in_force, plane, probe, namespace),
                what=f"the policy judging {probe['kind']} in force",
            )
        yield request.param, plane


def in_force(plane: ControlPlane, probe: dict[str, Any], namespace: str) -> bool:
    return "hidden-gpu guard" in (denial(plane, probe, namespace=namespace) or "")


def test_the_api_server_is_that_minor(minor: tuple[str, ControlPlane]) -> None:
    name, plane = minor
    assert plane.request("GET", "/version")["gitVersion"] == MINORS[name]


def test_every_policy_is_accepted(minor: tuple[str, ControlPlane]) -> None:
    """The API server compiled each policy's every expression (it refuses one it cannot compile) and bound it."""
    _, plane = minor
    base = "/apis/admissionregistration.k8s.io/v1"
    policies = [p["metadata"]["name"] for p in plane.request("GET", f"{base}/validatingadmissionpolicies")["items"]]
    bindings = [
        b["spec"]["policyName"] for b in plane.request("GET", f"{base}/validatingadmissionpolicybindings")["items"]
    ]
    assert sorted(policies) == sorted(bindings) and len(policies) == 4, (policies, bindings)


def test_every_policy_type_checks(minor: tuple[str, ControlPlane], bin_dir: Path) -> None:
    """No expressionWarnings for any guard policy from that minor's type checker; the canary's unknown field is warned
    of."""
    name, plane = minor
    plane.apply(CANARY)
    try:
        checked = subprocess.run(
            [bin_dir / f"hidden-gpu-typecheck-{name}", plane.kubeconfig("admin")],
            check=True, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        plane.request("DELETE", plane.path(CANARY))
    warnings = json.loads(checked.stdout)
    assert "notAField" in json.dumps(warnings.pop(CANARY["metadata"]["name"])), checked.stdout
    assert len(warnings) == 4 and all(found is None for found in warnings.values()), warnings


def test_every_route_is_denied_by_its_rule(minor: tuple[str, ControlPlane]) -> None:
    """Each route denied by its rule, or, where the minor does not serve the route's field, admitted with that field
    dropped by the API server itself (DROPPED), so that what is stored cannot take the route either."""
    name_of_minor, plane = minor
    wrong = {}
    routes = {name: (*route, TENANT) for name, route in ROUTES.items()}
    routes |= {f"claim {name}": (*route, ADMIN_NS) for name, route in CLAIM_ROUTES.items()}
    for name, (obj, rule, namespace) in routes.items():
        expected = rule if isinstance(rule, list) else [rule]
        if name in DROPPED.get(name_of_minor, {}):
            created = plane.create(with_namespace(obj, namespace), identity="tenant", dry_run=True)
            if DROPPED[name_of_minor][name] in json.dumps(created["spec"]):
                wrong[name] = f"admitted with {DROPPED[name_of_minor][name]}"
            continue
        message = denial(plane, obj, namespace=namespace)
        if message is None or "hidden-gpu guard, rule " not in message or rule_in(message) not in expected:
            wrong[name] = message or "admitted"
    assert wrong == {}


def test_every_benign_object_is_admitted(minor: tuple[str, ControlPlane]) -> None:
    _, plane = minor
    refused = {
        name: message
        for name, obj in {**BENIGN, **{f"claim {n}": o for n, o in CLAIM_BENIGN.items()}}.items()
        if (message := denial(plane, obj)) is not None
    }
    assert refused == {}


def test_a_configmap_with_a_device_key_is_denied(minor: tuple[str, ControlPlane]) -> None:
    _, plane = minor
    assert rule_in(denial(plane, KEYED_CONFIGMAP)) == "no-visible-devices-key"


def test_every_rendered_object_passes_the_schema(minor: tuple[str, ControlPlane]) -> None:
    """A strict server-side dry-run apply of each object the every-component stack renders: an unknown or
    misspelt field, a wrong type or a missing API refuses it. Before 1.36 the void policy's API is not served."""
    name, plane = minor
    refused = {}
    objects = render.render(EVERY).files.values()
    for namespace in (o for o in objects if o["kind"] == "Namespace"):
        plane.apply(namespace)  # for real: the objects in it need it
    for obj in objects:
        if obj["apiVersion"].startswith(OPERATOR_GROUP):
            continue
        if obj["kind"] == "Namespace":
            continue
        try:
            plane.request(
                "PATCH",
                f"{plane.path(obj)}?fieldManager=hidden-gpu&force=true&dryRun=All&fieldValidation=Strict",
                obj,
                content_type="application/apply-patch+yaml",
            )
        except (ApiError, KeyError) as error:
            refused[f"{obj['kind']} {obj['metadata']['name']}"] = str(error)
    # addVoid's MutatingAdmissionPolicy and its binding are admissionregistration.k8s.io/v1 from 1.36 only.
    unserved = {k for k in refused if k.startswith("MutatingAdmissionPolicy")} if name == "1.35" else set()
    assert len(unserved) == (2 if name == "1.35" else 0), refused
    assert {k: v for k, v in refused.items() if k not in unserved} == {}
