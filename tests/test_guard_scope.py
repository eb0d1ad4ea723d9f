"""guard.scope (issue 40): with `sharedNodes` the pod rules judge only pods that can reach a stack node (tolerating
its taint, naming a node, under an NVIDIA runtime), a pod entering that scope by an UPDATE as its create, and
hidden-gpu's own pods and RuntimeClasses tolerate the taint. The real scheduler's side: tests/real/test_scope.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from common.names import SHARED_NODE_TAINT
from common.tokens import Token
from offline.program import run_program
from stack_config import InvalidConfigError, parse_project_config
from tests.support.guard import admit, container, pod, pod_policy, rules_denying
from tests.support.objects import plugins
from tests.support.routes import GPU_POD, OURS, ROUTES
from tests.support.stacks import changed

SCOPED = changed(lambda c: c.__setitem__("hidden-gpu:guard", {"scope": "sharedNodes"}))
PRIVILEGED = pod(container(securityContext={"privileged": True}))
SHARED = {"key": SHARED_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}


def with_spec(obj: dict[str, Any], **spec: Any) -> dict[str, Any]:
    changed_pod = copy.deepcopy(obj)
    changed_pod["spec"].update(spec)
    return changed_pod


@pytest.fixture(scope="module")
def scoped() -> dict[str, Any]:
    return pod_policy(run_program(SCOPED, "test"))


def test_a_pod_that_cannot_reach_a_shared_node_is_not_judged(scoped: dict[str, Any]) -> None:
    assert admit(scoped, PRIVILEGED) is None  # the policy does not apply
    assert admit(scoped, with_spec(PRIVILEGED, tolerations=[{"key": "other", "operator": "Exists"}])) is None
    # The whole cluster's scope still judges it.
    assert rules_denying(pod_policy(run_program(changed(lambda c: None), "test")), PRIVILEGED) == ["privileged"]


@pytest.mark.parametrize(
    "reach",
    [
        {"tolerations": [SHARED]},
        {"tolerations": [{"key": SHARED_NODE_TAINT, "operator": "Equal", "value": "x", "effect": "NoExecute"}]},
        {"tolerations": [{"operator": "Exists"}]},  # every taint
        {"nodeName": "gpu-node-01"},
        {"runtimeClassName": OURS},
        {"runtimeClassName": "nvidia"},
    ],
    ids=["tolerates", "tolerates-its-key-any-way", "tolerates-everything", "names-a-node", "ours", "nvidia"],
)
def test_a_pod_that_can_reach_one_is_judged(scoped: dict[str, Any], reach: dict[str, Any]) -> None:
    assert "privileged" in rules_denying(scoped, with_spec(PRIVILEGED, **reach))


def test_every_route_stays_denied_where_the_pod_can_reach_a_shared_node(scoped: dict[str, Any]) -> None:
    wrong = {
        name: verdict
        for name, (obj, _) in ROUTES.items()
        if not (verdict := rules_denying(scoped, with_spec(obj, tolerations=[SHARED])))
    }
    assert wrong == {}
    assert admit(scoped, GPU_POD) == []


def test_a_pod_entering_the_scope_is_judged_as_its_create(scoped: dict[str, Any]) -> None:
    """A tenant's pod made out of scope (held by a gate, or Pending on a selector it cannot meet), then given the
    toleration by an UPDATE (tolerations may be added): judged whole, not only for what the update adds."""
    before = with_spec(PRIVILEGED, schedulingGates=[{"name": "wait"}])
    after = with_spec(before, tolerations=[SHARED])
    assert rules_denying(scoped, after, old=before) == ["privileged"]
    # An update of a pod already in scope judges only what it adds, as before.
    assert rules_denying(scoped, after, old=after) == []


def test_hidden_gpus_pods_and_classes_tolerate_the_taint() -> None:
    run = run_program(SCOPED, "test")
    (plugin,) = plugins(run)
    assert SHARED in plugin.inputs["spec"]["template"]["spec"]["tolerations"]
    for runtime_class in run.of_type(Token.RUNTIME_CLASS):
        assert runtime_class.inputs["scheduling"]["tolerations"] == [SHARED]
    # The same whatever the scope: switching it back before the taint goes must not strand a rolled plugin.
    (whole,) = plugins(run_program(changed(lambda c: None), "test"))
    assert whole.inputs["spec"]["template"] == plugin.inputs["spec"]["template"]


def test_the_scope_with_nvidia_as_the_default_runtime_is_refused() -> None:
    config = changed(
        lambda c: c.__setitem__("hidden-gpu:guard", {"scope": "sharedNodes", "nvidiaIsDefaultRuntime": True})
    )
    with pytest.raises(InvalidConfigError, match=r"hidden-gpu:guard.scope = \"sharedNodes\": with nvidiaIsDefault"):
        parse_project_config(config)
