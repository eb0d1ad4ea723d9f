"""The guard judged by a real kube-apiserver: the rendered policies are applied as they are, every route of
tests/support/routes.py is submitted as the tenant (an `edit` user in its own namespace) and must be
denied by the rule named there; every benign pod is admitted; the API server's own type check of the
expressions reports nothing; kubectl debug goes through the real subresource; addVoid mutates for real;
the quota refuses what exceeds it."""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from common.names import ENV_KEYS_POLICY_NAME, OPERATOR_NAMESPACE, POLICY_NAME
from common.tokens import Token
from e2e.controlplane import ApiError, ControlPlane
from offline.program import ProgramRun, run_program
from tests.real.conftest import TENANT, eventually
from tests.real.harness import CLASSES, apply_guard, denial, guard_objects, rule_in, with_namespace
from tests.support.guard import container, pod, with_ephemeral
from tests.support.routes import BENIGN, GPU_POD, OURS, ROUTES, VOID
from tests.support.stacks import changed


@pytest.fixture(scope="module")
def guard(plane: ControlPlane) -> Iterator[ProgramRun]:
    for name, handler in CLASSES.items():
        plane.apply(
            {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": handler}
        )
    run = apply_guard(plane, changed(lambda c: c.__setitem__("hidden-gpu:guard", {"plainRuntimeClasses": ["gvisor"]})))
    yield run
    for obj in guard_objects(run):
        plane.request("DELETE", plane.path(obj))


def test_the_api_server_type_checks_every_expression_without_a_warning(plane: ControlPlane, guard: ProgramRun) -> None:
    def type_checked(path: str) -> dict[str, Any] | None:
        policy: dict[str, Any] = plane.request("GET", path)
        return (
            policy if policy.get("status", {}).get("observedGeneration") == policy["metadata"]["generation"] else None
        )

    for name in (POLICY_NAME, ENV_KEYS_POLICY_NAME):
        path = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}"
        checked = eventually(functools.partial(type_checked, path), what=f"{name} type-checked")
        assert checked["status"].get("typeChecking", {}).get("expressionWarnings") in (None, []), checked["status"]


@pytest.mark.parametrize("route", ROUTES, ids=list(ROUTES))
def test_every_route_is_denied_with_its_rule(plane: ControlPlane, guard: ProgramRun, route: str) -> None:
    obj, rule = ROUTES[route]
    expected = rule if isinstance(rule, list) else [rule]
    assert rule_in(denial(plane, obj)) in expected


@pytest.mark.parametrize("name", BENIGN, ids=list(BENIGN))
def test_benign_pods_are_admitted(plane: ControlPlane, guard: ProgramRun, name: str) -> None:
    assert denial(plane, BENIGN[name]) is None


def test_a_configmap_or_secret_carrying_a_device_key_is_denied(plane: ControlPlane, guard: ProgramRun) -> None:
    for kind in ("ConfigMap", "Secret"):
        obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": "g"}, "data": {"NVIDIA_GDS": "ZW5hYmxlZA=="}}
        assert rule_in(denial(plane, obj)) == "no-visible-devices-key"
        assert denial(plane, {**obj, "data": {"MODEL": "bGxhbWE="}}) is None
    # A Secret's stringData reaches admission folded into data.
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s"},
        "stringData": {"NVIDIA_VISIBLE_DEVICES": "all"},
    }
    assert rule_in(denial(plane, secret)) == "no-visible-devices-key"


def test_exempt_namespaces_are_not_judged(plane: ControlPlane, guard: ProgramRun) -> None:
    assert denial(plane, ROUTES["privileged"][0], namespace=OPERATOR_NAMESPACE, identity="admin") is None
    assert denial(plane, ROUTES["privileged"][0], namespace=TENANT, identity="admin") is not None


TRUSTED = {"hidden-gpu.io/trusted": "true"}


def test_a_label_exempts_a_namespace_on_the_real_api_server(plane: ControlPlane, guard: ProgramRun) -> None:
    """issue 29, 2: with the exemption in match conditions, kube-apiserver judged a labelled namespace like a
    tenant's (it gives match conditions no namespace). As a namespace selector it holds, for the void policy
    too; the same pod in an unlabelled namespace, or one whose label has another value, is still judged."""
    for name, labels in (("cni-trusted", TRUSTED), ("cni-lookalike", {"hidden-gpu.io/trusted": "yes"})):
        plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    config = changed(
        lambda c: c.__setitem__(
            "hidden-gpu:guard", {"plainRuntimeClasses": ["gvisor"], "exemptNamespaceLabels": TRUSTED, "addVoid": True}
        )
    )
    probe = ROUTES["host-pid"][0]
    # The void policy: a sidecar without a request gets `void` in a tenant's namespace (once the policy is
    # loaded) and is left alone in the trusted one.
    sidecar = pod(container(gpus="1"), container("sidecar"), runtimeClassName=OURS)

    def sidecar_env(namespace: str) -> list[Any]:
        answer = plane.create(with_namespace(sidecar, namespace), identity="admin", dry_run=True)
        return list(answer["spec"]["containers"][1].get("env", []))

    run = apply_guard(plane, config)
    try:
        # The policy plugin picks up the changed selector from its informer: the exemption holds once it has.
        eventually(lambda: denial(plane, probe, namespace="cni-trusted", identity="admin") is None, what="exemption")
        assert rule_in(denial(plane, probe, namespace="cni-lookalike", identity="admin")) == "host-namespaces"
        assert rule_in(denial(plane, probe, namespace=TENANT, identity="admin")) == "host-namespaces"
        eventually(lambda: sidecar_env(TENANT), what="void in force")
        assert sidecar_env("cni-trusted") == []
    finally:
        for obj in guard_objects(run):
            if obj["kind"].startswith("Mutating"):
                plane.request("DELETE", plane.path(obj))
        apply_guard(plane, changed(lambda c: c.__setitem__("hidden-gpu:guard", {"plainRuntimeClasses": ["gvisor"]})))
        # The next tests need the module's guard as it was: no void added, no namespace selector.
        # Without void the sidecar is denied for want of a request.
        gone = "gpu-runtime-needs-a-request"
        eventually(lambda: gone in (denial(plane, sidecar, namespace=TENANT, identity="admin") or ""), what="void gone")
        eventually(lambda: denial(plane, probe, namespace="cni-trusted", identity="admin"), what="exemption gone")


def created(plane: ControlPlane, obj: dict[str, Any], name: str) -> dict[str, Any]:
    placed = with_namespace(obj, TENANT)
    placed["metadata"]["name"] = name
    return dict(plane.create(placed, identity="tenant"))


def test_kubectl_debug_through_the_subresource(plane: ControlPlane, guard: ProgramRun) -> None:
    """The real `pods/ephemeralcontainers` UPDATE: a debug container without void is denied; with void and
    the `general` profile's SYS_PTRACE it is admitted; SYS_ADMIN is not."""
    live = created(plane, GPU_POD, "debug-target")
    path = f"/api/v1/namespaces/{TENANT}/pods/debug-target/ephemeralcontainers"
    debugger = {"name": "debugger", "image": "busybox", "targetContainerName": "app"}

    def attach(extra: dict[str, Any]) -> str | None:
        for _ in range(10):  # the scheduler writes the pod's status meanwhile: retry a conflict, as kubectl does
            current = plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods/debug-target")
            current.pop("__warnings__", None)
            try:
                plane.request("PUT", path, with_ephemeral(current, {**debugger, **extra}), identity="tenant")
            except ApiError as error:
                if error.code == 409:
                    continue
                return error.message
            return None
        pytest.fail("kept conflicting")

    assert rule_in(attach({})) == "gpu-runtime-needs-a-request"
    assert rule_in(attach({**VOID, "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}})) == "capabilities"
    assert attach({**VOID, "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}}) is None
    assert live["metadata"]["name"] == "debug-target"


def test_a_pod_update_cannot_change_a_container_the_guard_no_longer_reads(
    plane: ControlPlane, guard: ProgramRun
) -> None:
    """The guard judges no container on a pod UPDATE because the API server's own validation refuses any
    change but the image first: this is that refusal."""
    created(plane, GPU_POD, "update-target")
    swapped = copy.deepcopy(GPU_POD)
    swapped["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    with pytest.raises(ApiError) as refused:  # a merge patch: no resourceVersion to conflict on
        plane.request(
            "PATCH",
            f"/api/v1/namespaces/{TENANT}/pods/update-target",
            {"spec": {"containers": swapped["spec"]["containers"]}},
            identity="tenant",
            content_type="application/strategic-merge-patch+json",
        )
    assert refused.value.code == 422 and "pod updates may not change fields" in refused.value.message


def test_the_tenant_cannot_bind_pods_itself(plane: ControlPlane) -> None:
    """pods/binding would skip the scheduler like nodeName does: `edit` does not grant it."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {"namespace": TENANT, "verb": "create", "resource": "pods", "subresource": "binding"}
        },
    }
    answer = plane.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review, identity="tenant")
    assert answer["status"]["allowed"] is False
    edit = {**review, "spec": {"resourceAttributes": {"namespace": TENANT, "verb": "create", "resource": "pods"}}}
    assert plane.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", edit, identity="tenant")[
        "status"
    ]["allowed"]


def test_the_largest_pod_is_still_judged(plane: ControlPlane, guard: ProgramRun) -> None:
    """Hundreds of containers, some kilobytes each, near the API server's request size: judged within the
    CEL cost limit, both ways."""
    filler = {"name": "PAD", "value": "x" * 1000}
    many = [container(f"c{i}", gpus="1", env=[filler]) for i in range(1200)]
    admitted = pod(*many, runtimeClassName=OURS)
    started = time.monotonic()
    assert denial(plane, admitted) is None
    many[-1] = container("last", env=[filler])
    assert rule_in(denial(plane, pod(*many, runtimeClassName=OURS))) == "gpu-runtime-needs-a-request"
    assert time.monotonic() - started < 30


def test_add_void_mutates_for_real(plane: ControlPlane, guard: ProgramRun) -> None:
    """The MutatingAdmissionPolicy as the API server runs it: a sidecar and an init container without a
    request get NVIDIA_VISIBLE_DEVICES=void merged into their env (their own variables kept), the GPU
    container is untouched, and the guard then admits the pod; `=all` is left alone and denied."""
    config = changed(lambda c: c.__setitem__("hidden-gpu:guard", {"plainRuntimeClasses": ["gvisor"], "addVoid": True}))
    run = apply_guard(plane, config)
    try:
        tenant = pod(
            container(gpus="1"),
            container("sidecar", env=[{"name": "MODEL", "value": "x"}]),
            initContainers=[container("fetch")],
            runtimeClassName=OURS,
        )
        placed = with_namespace(tenant, TENANT)

        def mutated() -> dict[str, Any]:
            return dict(plane.create(placed, identity="tenant", dry_run=True))

        answer = eventually(lambda: mutated()["spec"]["containers"][1].get("env", [])[-1:] == [VOID_ENV] and mutated())
        assert answer["spec"]["containers"][1]["env"] == [{"name": "MODEL", "value": "x"}, VOID_ENV]
        assert answer["spec"]["initContainers"][0]["env"] == [VOID_ENV]
        assert "env" not in answer["spec"]["containers"][0]
        own = pod(
            container(gpus="1"),
            container("sidecar", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
            runtimeClassName=OURS,
        )
        # Both rules fail for that sidecar; the API server reports the first that fails.
        assert rule_in(denial(plane, own)) in ("gpu-runtime-needs-a-request", "visible-devices-env")
    finally:
        for obj in guard_objects(run):
            if obj["kind"].startswith("Mutating"):
                plane.request("DELETE", plane.path(obj))
        apply_guard(plane, changed(lambda c: c.__setitem__("hidden-gpu:guard", {"plainRuntimeClasses": ["gvisor"]})))


VOID_ENV = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def test_warn_mode_admits_and_says_why(plane: ControlPlane, guard: ProgramRun) -> None:
    warn = changed(lambda c: c.__setitem__("hidden-gpu:guard", {"plainRuntimeClasses": ["gvisor"], "mode": "warn"}))
    run = run_program(warn, "test")
    for obj in guard_objects(run):
        plane.apply(obj)
    try:
        probe = with_namespace(ROUTES["host-pid"][0], TENANT)
        answer = eventually(
            lambda: (a := plane.create(probe, identity="tenant", dry_run=True))["__warnings__"] and a, what="warn mode"
        )
        assert any("hidden-gpu guard, rule host-namespaces" in w for w in answer["__warnings__"]), answer[
            "__warnings__"
        ]
    finally:
        apply_guard(plane, changed(lambda c: c.__setitem__("hidden-gpu:guard", {"plainRuntimeClasses": ["gvisor"]})))


def test_the_quota_refuses_gpus_over_it(plane: ControlPlane) -> None:
    """ResourceQuota admission on requests.nvidia.com/gpu, its status filled by the real quota controller."""
    run = run_program(changed(lambda c: c.__setitem__("hidden-gpu:quotas", {"ml-training": 1})), "test")
    quota = next(r.inputs for r in run.kubernetes_objects if r.type == Token.RESOURCE_QUOTA)
    plane.apply(quota)
    name, namespace = quota["metadata"]["name"], quota["metadata"]["namespace"]
    eventually(
        lambda: (
            plane.request("GET", f"/api/v1/namespaces/{namespace}/resourcequotas/{name}").get("status", {}).get("hard")
        ),
        what="the quota counted",
    )
    two = pod(container(gpus="2"))
    refused = denial(plane, two, namespace=namespace)
    assert refused is not None and "exceeded quota" in refused and "requests.nvidia.com/gpu" in refused, refused
    assert denial(plane, pod(container(gpus="1")), namespace=namespace) is None


def test_a_gated_pod_made_in_warn_is_judged_when_its_gates_go(plane: ControlPlane, guard: ProgramRun) -> None:
    """issue 40, 1: docs/operations.md rolls the guard out in warn, then enforce. A pod the tenant made in warn with
    schedulingGates and a denied route waited there; in enforce, the UPDATE that removes its gates (what hands it to
    the real scheduler) is denied by the same rule as its CREATE would be."""
    obj, rule = ROUTES["privileged"]
    gated = with_namespace(obj, TENANT)
    gated["metadata"]["name"] = "gated-in-warn"
    gated["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    warn = changed(lambda c: c.__setitem__("hidden-gpu:guard", {"plainRuntimeClasses": ["gvisor"], "mode": "warn"}))
    for obj_ in guard_objects(run_program(warn, "test")):
        plane.apply(obj_)
    try:
        eventually(lambda: plane.create(gated, identity="tenant"), what="the gated pod admitted in warn")
    finally:
        apply_guard(plane, changed(lambda c: c.__setitem__("hidden-gpu:guard", {"plainRuntimeClasses": ["gvisor"]})))
    path = f"/api/v1/namespaces/{TENANT}/pods/gated-in-warn"
    try:
        with pytest.raises(ApiError) as refused:
            plane.request(
                "PATCH", path, {"spec": {"schedulingGates": None}}, identity="tenant",
                content_type="application/merge-patch+json",
            )  # fmt: skip
        assert rule_in(refused.value.message) == (rule if isinstance(rule, str) else rule[0])
        assert plane.request("GET", path)["spec"].get("schedulingGates"), "still gated"
    finally:  # the session's plane: cluster.verify in later modules would (rightly) name it
        plane.request("DELETE", path)
