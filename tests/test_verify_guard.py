"""cluster.verify on the guard, against an API server on loopback serving what the program renders for the stack.
Every admission object must exist as declared, the void policy where the stack adds it; each safety field of the
live guard is compared, so one that fails open or exempts a tenant is a mismatch; no RuntimeClass declared plain
may run NVIDIA's toolkit; guard.scope sharedNodes needs its taint on every stack node. What the guard's warn phase
let through (objects admission never judges again) is named in a judged namespace, and a kind verify may not list
is a mismatch, not a clean result."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from common.cli import EXIT_FINDING, EXIT_OK
from common.names import PROJECT
from tests.support.fake_apiserver import Cluster, pod
from tests.support.stacks import write_stack
from tests.support.verify_cluster import PROD_CONFIG, healthy, mismatches, run


def test_guard_objects_must_exist_as_declared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = healthy(PROD_CONFIG)
    binding = next(b for b in cluster.bindings if b["metadata"]["name"] == "hidden-gpu-access-guard")
    binding["spec"]["validationActions"] = ["Warn", "Audit"]  # someone relaxed prod
    policy = next(p for p in cluster.policies if p["metadata"]["name"] == "hidden-gpu-access-guard")
    policy["spec"]["validations"].pop()  # and dropped a rule
    cluster.runtime_classes.clear()
    cluster.quotas.pop()
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_FINDING
    found = {" ".join(row[1:3]) for row in mismatches(out)}
    assert "binding hidden-gpu-access-guard" in found
    assert "ValidatingAdmissionPolicy hidden-gpu-access-guard" in found
    assert "RuntimeClass hidden-gpu-pool-shared" in found
    assert any(row[0] in ("ml-training", "ml-inference") for row in mismatches(out))


def test_the_void_policy_is_checked_where_the_stack_declares_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = copy.deepcopy(PROD_CONFIG)
    config[f"{PROJECT}:guard"] = {"addVoid": True}
    stack = str(write_stack(tmp_path, config))
    cluster = healthy(config, "case")
    status, out, _ = run(tmp_path, cluster, capsys, stack=stack)
    assert status == EXIT_OK, out
    assert "MutatingAdmissionPolicy hidden-gpu-add-void" in out
    assert out.strip().endswith("in 83 checks, 24 API requests")
    cluster.mutating_policies[0]["spec"]["mutations"] = []  # someone emptied it
    cluster.mutating_bindings.clear()
    status, out, _ = run(tmp_path, cluster, capsys, stack=stack)
    assert status == EXIT_FINDING
    assert {" ".join(row[1:3]) for row in mismatches(out)} == {
        "MutatingAdmissionPolicy hidden-gpu-add-void",
        "binding hidden-gpu-add-void",
    }


def test_a_plain_runtime_class_with_an_nvidia_handler_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The guard judges a class declared plain as plain: verify proves no such class runs NVIDIA's toolkit."""
    config = copy.deepcopy(PROD_CONFIG)
    config[f"{PROJECT}:guard"] = {"plainRuntimeClasses": ["gvisor", "sandboxed"]}
    stack = str(write_stack(tmp_path, config))
    cluster = healthy(config, "case")
    cluster.runtime_classes += [
        {"metadata": {"name": "gvisor"}, "handler": "runsc"},
        {"metadata": {"name": "sandboxed"}, "handler": "nvidia-experimental"},
    ]
    status, out, _ = run(tmp_path, cluster, capsys, stack=stack)
    assert status == EXIT_FINDING, out
    assert mismatches(out) == [
        ["cluster", "plain", "RuntimeClass", "sandboxed", "not", "NVIDIA's", "nvidia-experimental", "MISMATCH"]
    ]


def guard_policy(cluster: Cluster) -> dict[str, Any]:
    return next(p for p in cluster.policies if p["metadata"]["name"] == "hidden-gpu-access-guard")


def guard_binding(cluster: Cluster) -> dict[str, Any]:
    return next(b for b in cluster.bindings if b["metadata"]["name"] == "hidden-gpu-access-guard")


def exempt_a_tenant(cluster: Cluster) -> None:
    by_name = guard_policy(cluster)["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]
    by_name["values"].append("ml-training")


@pytest.mark.parametrize(
    ("tamper", "check"),
    [
        (lambda c: guard_policy(c)["spec"].__setitem__("failurePolicy", "Ignore"), "failurePolicy"),
        (
            lambda c: guard_policy(c)["spec"]["matchConstraints"]["resourceRules"][0].__setitem__(
                "resources", ["pods"]
            ),
            "matches",
        ),
        (exempt_a_tenant, "namespaceSelector"),
        (lambda c: guard_policy(c)["spec"]["variables"].pop(), "variables"),
        (
            lambda c: guard_policy(c)["spec"]["matchConstraints"].__setitem__(
                "namespaceSelector",
                {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["ml"]}]},
            ),
            "namespaceSelector",
        ),
        (
            lambda c: guard_binding(c)["spec"].__setitem__(
                "matchResources", {"namespaceSelector": {"matchLabels": {"x": "y"}}}
            ),
            "scope",
        ),
        (lambda c: guard_binding(c)["spec"].__setitem__("policyName", "allow-all"), "scope"),
    ],
    ids=[
        "fails-open",
        "matches-less",
        "exempts-a-tenant",
        "variable-dropped",
        "exempts-a-label",
        "bound-to-fewer-namespaces",
        "bound-to-another-policy",
    ],
)
def test_every_safety_field_of_the_live_guard_is_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tamper: Any, check: str
) -> None:
    """issue 21, 3: verify said "as declared" for a guard that exempted a tenant or failed open."""
    cluster = healthy(PROD_CONFIG)
    tamper(cluster)
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_FINDING, out
    assert [row[3] for row in mismatches(out)] == [check], out


def test_what_the_warn_phase_left_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 40, 1: objects made while the guard only warned are never judged again by admission. verify names each
    in a namespace the guard judges (ml-team), none in an exempt one (kube-system)."""
    cluster = healthy(PROD_CONFIG)
    cluster.namespaces = [{"metadata": {"name": n}} for n in ("ml-team", "kube-system")]
    keys = {"NVIDIA_VISIBLE_DEVICES": "all", "OTHER": "x"}
    cluster.config_maps += [
        {"metadata": {"name": "env", "namespace": "ml-team"}, "data": keys},
        {"metadata": {"name": "env", "namespace": "kube-system"}, "data": keys},
    ]
    cluster.secrets = [
        {"metadata": {"name": "s", "namespace": "ml-team"}, "data": {"NVIDIA_GDS": "ZW5hYmxlZA=="}},
        # Helm's release records are not read (about 1 MiB each, no env).
        {"metadata": {"name": "h", "namespace": "ml-team"}, "type": "helm.sh/release.v1", "data": {"NVIDIA_GDS": ""}},
    ]
    requests = [{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
    cluster.resource_claims = [
        {"metadata": {"name": "c", "namespace": "ml-team"}, "spec": {"devices": {"requests": requests}}}
    ]
    cluster.claim_templates = [
        {"metadata": {"name": "t", "namespace": "ml-team"}, "spec": {"spec": {"devices": {"requests": requests}}}}
    ]
    warned = pod("warned", "ml-team", "gpu-node-01", {})
    warned["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    cluster.pods.append(warned)
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_FINDING
    wrong = {tuple(row[:3]) for row in mismatches(out)}
    assert wrong == {
        ("ml-team", "ConfigMap", "env:"),
        ("ml-team", "Secret", "s:"),
        ("ml-team", "ResourceClaim", "c:"),
        ("ml-team", "ResourceClaimTemplate", "t:"),
        ("ml-team", "Pod", "warned:"),
    }, out
    assert "NVIDIA_VISIBLE_DEVICES" in out and "claim-device-classes" in out and "privileged" in out


def test_a_collection_it_may_not_list_is_a_mismatch_not_a_clean_result() -> None:
    """An identity without `list secrets` (say a read-only kubeconfig made before verify read them): the leftovers of
    that kind cannot be judged, and verify says so rather than passing."""
    from cluster.leftovers import check_leftovers  # noqa: PLC0415
    from stack_config import parse_project_config  # noqa: PLC0415

    stack = parse_project_config(PROD_CONFIG)
    listed: dict[str, list[dict[str, Any]] | None] = {
        "namespaces": [],
        "configmaps": [],
        "secrets": None,
        "resourceclaims": [],
        "templates": [],
        "pods": [],
    }
    checks = [c for c in check_leftovers(stack, listed) if not c.ok]
    assert [(c.what, c.actual) for c in checks] == [
        ("list secrets (what the rollout left)", "forbidden: grant get/list")
    ]


def test_the_scoped_guard_needs_its_taint_on_every_stack_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """guard.scope sharedNodes admits untouched what cannot reach a stack node: only the taint keeps such pods off
    it. A node without it is named with the command that puts it there; a pod bound to a stack node that the
    scoped rules would deny is a leftover, one on another node is not."""
    config = {**PROD_CONFIG, "hidden-gpu:guard": {"scope": "sharedNodes"}}
    cluster = healthy(config)
    for found in cluster.nodes:
        if found["metadata"]["name"] == "gpu-node-01":
            found["spec"] = {"taints": [{"key": "hidden-gpu.io/shared-node", "value": "true", "effect": "NoSchedule"}]}
    privileged = {"containers": [{"name": "a", "image": "x", "securityContext": {"privileged": True}}]}
    cluster.namespaces = [{"metadata": {"name": "ml-team"}}]
    cluster.pods += [
        {"metadata": {"name": "elsewhere", "namespace": "ml-team"}, "spec": {**privileged, "nodeName": "cpu-node-01"}},
        {"metadata": {"name": "shared", "namespace": "ml-team"}, "spec": {**privileged, "nodeName": "gpu-node-01"}},
    ]
    status, out, _ = run(tmp_path, cluster, capsys, stack=str(write_stack(tmp_path, config, "prod")))
    assert status == EXIT_FINDING
    rows = [" ".join(row) for row in mismatches(out)]
    assert rows == [
        "gpu-node-02 taint hidden-gpu.io/shared-node (guard.scope sharedNodes) NoSchedule <none: kubectl taint node"
        " gpu-node-02 hidden-gpu.io/shared-node=true:NoSchedule> MISMATCH",
        "ml-team Pod shared: the enforcing guard would deny it none privileged MISMATCH",
    ], out
