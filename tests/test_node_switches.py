"""The node-switches policy as rendered, in a real CEL engine: the operator's operands toggle and the hand edits
that would un-hide a node are refused; the operator's own deletions under the toggle, hidden-gpu's own transitions
and a release pass. The real API server and the real GPU Operator: tests/real/test_gpu_operator.py."""

from __future__ import annotations

from typing import Any

import pytest

from common.names import (
    DEVICE_PLUGIN_LABEL,
    NODE_LABEL,
    NODE_SWITCHES_POLICY_NAME,
    OPERAND_LABELS,
    OPERANDS_LABEL,
    OPERANDS_OFF_ANNOTATION,
)
from common.tokens import Token
from desired.node_switches import policy_spec
from offline.program import run_program
from tests.support.guard import evaluate
from tests.support.stacks import valid_config

DCGM = OPERAND_LABELS["dcgm"]
HELD = {NODE_LABEL: "n1", DEVICE_PLUGIN_LABEL: "false", DCGM: "false", "nvidia.com/gpu.deploy.driver": "true"}
RECORD = {OPERANDS_OFF_ANNOTATION: "device-plugin,dcgm"}


def node(labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "labels": labels, **({"annotations": annotations} if annotations else {})}}


def judge(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """None where the policy admits the update (or does not judge it), else its message."""
    spec = policy_spec()
    context: dict[str, Any] = {"object": new, "oldObject": old, "request": {"operation": "UPDATE"}}
    if not all(evaluate(c["expression"], context) for c in spec["matchConditions"]):
        return None
    context["variables"] = {}
    for variable in spec["variables"]:
        context["variables"][variable["name"]] = evaluate(variable["expression"], context)
    [check] = spec["validations"]
    return None if evaluate(check["expression"], context) else str(evaluate(check["messageExpression"], context))


def without(labels: dict[str, str], *keys: str) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k not in keys}


def test_the_rendered_policy_is_the_one_evaluated_and_always_denies() -> None:
    run = run_program(valid_config(), "test")
    [policy] = [
        p.inputs
        for p in run.of_type(Token.ADMISSION_POLICY)
        if p.inputs["metadata"]["name"] == NODE_SWITCHES_POLICY_NAME
    ]
    [binding] = [
        b.inputs
        for b in run.of_type(Token.ADMISSION_BINDING)
        if b.inputs["metadata"]["name"] == NODE_SWITCHES_POLICY_NAME
    ]
    assert policy["spec"]["variables"] == policy_spec()["variables"]
    assert policy["spec"]["validations"][0]["expression"] == policy_spec()["validations"][0]["expression"]
    assert binding["spec"]["validationActions"] == ["Deny"]


@pytest.mark.parametrize(
    ("labels", "why"),
    [
        ({**HELD, DEVICE_PLUGIN_LABEL: "true"}, DEVICE_PLUGIN_LABEL),  # the operator's plugin back on a hidden node
        (without(HELD, DCGM), DCGM),  # `kubectl label node n1 ...dcgm-`
        ({**HELD, DCGM: "False"}, DCGM),  # only the operator's own spelling counts as off
    ],
)
def test_a_held_switch_turned_on_or_removed_is_refused_naming_it(labels: dict[str, str], why: str) -> None:
    message = judge(node(HELD, RECORD), node(labels, RECORD))
    assert message is not None and f"{why} must stay false" in message and "cluster.release" in message


def test_the_operands_toggle_passes_off_and_is_refused_back_on_until_the_switches_are_false() -> None:
    toggled = {**HELD, OPERANDS_LABEL: "false"}
    # The operator obeys the toggle by deleting every switch: nothing runs without its switch.
    emptied = without(toggled, DEVICE_PLUGIN_LABEL, DCGM, "nvidia.com/gpu.deploy.driver")
    assert judge(node(toggled, RECORD), node(emptied, RECORD)) is None
    # The toggle removed while the held switches are absent: the operator would add them as `true`.
    message = judge(node(emptied, RECORD), node(without(emptied, OPERANDS_LABEL), RECORD))
    assert message is not None and f"{DEVICE_PLUGIN_LABEL} must stay false" in message
    # Back at false first (what the refusal says), then the toggle comes off.
    restored = {**emptied, DEVICE_PLUGIN_LABEL: "false", DCGM: "false"}
    assert judge(node(emptied, RECORD), node(restored, RECORD)) is None
    assert judge(node(restored, RECORD), node(without(restored, OPERANDS_LABEL), RECORD)) is None


def test_hidden_gpus_own_transitions_and_a_release_pass() -> None:
    # A node that now exposes a GPU: its patch drops a switch and its record in one write.
    assert judge(node(HELD, RECORD), node(without(HELD, DCGM), {OPERANDS_OFF_ANNOTATION: "device-plugin"})) is None
    # cluster.release: the node label and the switches go in one write.
    assert judge(node(HELD, RECORD), node({"nvidia.com/gpu.deploy.driver": "true"})) is None
    # A switch hidden-gpu does not hold is the operator's to set.
    assert judge(node(HELD, RECORD), node({**HELD, "nvidia.com/gpu.deploy.driver": "false"}, RECORD)) is None


def test_a_write_that_drops_the_record_alone_is_judged_by_the_old_one() -> None:
    message = judge(node(HELD, RECORD), node({**HELD, DCGM: "true"}))
    assert message is not None and f"{DCGM} must stay false" in message


def test_a_node_hidden_before_the_record_keeps_its_device_plugin_switch() -> None:
    assert judge(node(HELD), node({**HELD, DEVICE_PLUGIN_LABEL: "true"})) is not None
    assert judge(node(HELD), node({**HELD, DCGM: "true"})) is None


def test_a_node_already_out_of_line_still_takes_writes_that_change_no_switch() -> None:
    """A hidden node whose switch was turned on before the policy existed (or by hand with the binding gone): a cordon,
    a taint, the kubelet's status write, another label all pass; only a write that changes a switch, the toggle, the
    node label or the record is judged."""
    broken = {**HELD, DEVICE_PLUGIN_LABEL: "true"}
    cordoned = node(broken, RECORD)
    cordoned["spec"] = {"unschedulable": True}
    assert judge(node(broken, RECORD), cordoned) is None
    assert judge(node(broken, RECORD), node({**broken, "team": "ml"}, RECORD)) is None
    # Putting it right passes; touching the broken switch again, to anything but false, does not.
    assert judge(node(broken, RECORD), node(HELD, RECORD)) is None
    assert judge(node(broken, RECORD), node({**broken, DCGM: "true"}, RECORD)) is not None


def test_the_status_subresource_is_matched() -> None:
    """`kubectl patch node N --subresource=status` writes labels too (the kubelet's PatchNodeStatus does)."""
    assert "nodes/status" in policy_spec()["matchConstraints"]["resourceRules"][0]["resources"]
