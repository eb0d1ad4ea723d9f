"""The guard's node-switches policy: on a node hidden-gpu hides, the GPU Operator switches it holds off stay off,
whoever writes the node. Plain data, no Pulumi (AccessGuard declares it; the tests evaluate it in a real CEL engine
and on the real API server beside the real operator).

Why admission and not repair: the operator's documented way to take its operands off a node,
`nvidia.com/gpu.deploy.operands=false`, makes it delete every `gpu.deploy.*` label there, and removing that label
makes it add each absent one as `true`: its all-GPU device plugin then runs on a hidden node
(gpu-operator@v0.0.0-20250917190837-d73a0086a6ba controllers/state_manager.go:344-391; run in
tests/real/test_gpu_operator.py). The rule lets the first step through (no operand runs on a node without its
switch: every operand DaemonSet selects `gpu.deploy.<operand>: "true"`) and refuses the second until the switches
are back at `false`, so the operator, which honours a present value, adds only what hidden-gpu leaves on.

It judges only nodes labelled `hidden-gpu.io/node` and denies in every guard mode: it judges no tenant, and a
platform in `warn` must not have a node un-hidden either. `cluster.release` passes: it removes the node label and
the switches in one write."""

from __future__ import annotations

from typing import Any

from common.names import (
    DEPLOY_LABEL_PREFIX,
    DEVICE_PLUGIN_LABEL,
    NODE_LABEL,
    NODE_SWITCHES_POLICY_NAME,
    OPERAND_LABELS,
    OPERANDS_LABEL,
    OPERANDS_OFF_ANNOTATION,
    PROJECT,
)
from desired.guard_settings import cel

# Every operand hidden-gpu may hold off, as named after the prefix (the record's spelling).
OPERANDS = tuple(label.removeprefix(DEPLOY_LABEL_PREFIX) for label in (DEVICE_PLUGIN_LABEL, *OPERAND_LABELS.values()))
RULE = "node-switches"
MATCH = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes", "nodes/status"]}
"""Writes of the node, through the status subresource too (it writes labels and annotations as well: the kubelet's
PatchNodeStatus does); the match conditions let only writes that change a switch or the record reach the rule."""
HIDDEN_NODE = f"has(object.metadata.labels) && {cel(NODE_LABEL)} in object.metadata.labels"


def _changed(field: str, key: str) -> str:
    """CEL: the write changes this label or annotation (added, removed or another value)."""
    new, old = f"object.metadata.{field}", f"oldObject.metadata.{field}"
    return (
        f"((has({new}) && {cel(key)} in {new} ? {new}[{cel(key)}] : '<absent>')"
        f" != (has({old}) && {cel(key)} in {old} ? {old}[{cel(key)}] : '<absent>'))"
    )


# Only a write that changes a switch, the operands toggle, the node label or the record is judged: a node already out
# of line (its switches changed before the policy existed) still takes every other write, heartbeats, cordons and
# taints included, and the operator's other labels.
SWITCHES_CHANGED = " || ".join(
    [
        *(_changed("labels", DEPLOY_LABEL_PREFIX + op) for op in OPERANDS),
        _changed("labels", OPERANDS_LABEL),
        _changed("labels", NODE_LABEL),
        _changed("annotations", OPERANDS_OFF_ANNOTATION),
    ]
)


def _annotation(obj: str) -> str:
    return f"has({obj}.metadata.annotations) && {cel(OPERANDS_OFF_ANNOTATION)} in {obj}.metadata.annotations"


def variables() -> list[tuple[str, str]]:
    """The record (the new object's; else the old one's, as a write that drops the annotation alone would leave it;
    else the device plugin's switch alone, for a node hidden before the record existed), the operands it holds,
    and those of them the write would leave on."""
    off = cel(OPERANDS_OFF_ANNOTATION)
    labels = "object.metadata.labels"
    return [
        (
            "record",
            f"{_annotation('object')} ? object.metadata.annotations[{off}] : "
            f"({_annotation('oldObject')} ? oldObject.metadata.annotations[{off}] : "
            f"{cel(DEVICE_PLUGIN_LABEL.removeprefix(DEPLOY_LABEL_PREFIX))})",
        ),
        ("held", f"{cel(list(OPERANDS))}.filter(op, (',' + variables.record + ',').contains(',' + op + ','))"),
        (
            "operandsOff",
            f"{cel(OPERANDS_LABEL)} in {labels} && {labels}[{cel(OPERANDS_LABEL)}] == 'false'",
        ),
        (
            "leftOn",
            f"variables.held.filter(op, !({cel(DEPLOY_LABEL_PREFIX)} + op in {labels} ? "
            f"{labels}[{cel(DEPLOY_LABEL_PREFIX)} + op] == 'false' : variables.operandsOff))",
        ),
    ]


def message_expression() -> str:
    return (
        f"'{PROJECT} guard, rule {RULE}: node ' + object.metadata.name + ' is hidden by {PROJECT} ("
        f"{NODE_LABEL}); {DEPLOY_LABEL_PREFIX}' + variables.leftOn[0] + ' must stay false (or be absent while "
        f"{OPERANDS_LABEL}=false): set it back to false first, or give the node back with "
        f"python -m cluster.release'"
    )


def policy_spec() -> dict[str, Any]:
    """The ValidatingAdmissionPolicy's spec, in wire names."""
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [MATCH]},
        "matchConditions": [
            {"name": "hidden-node", "expression": HIDDEN_NODE},
            {"name": "switches-changed", "expression": SWITCHES_CHANGED},
        ],
        "variables": [{"name": name, "expression": expression} for name, expression in variables()],
        "validations": [
            {
                "expression": "size(variables.leftOn) == 0",
                "message": f"{PROJECT} guard, rule {RULE}: a switch {PROJECT} holds off on this node would be on",
                "messageExpression": message_expression(),
                "reason": "Forbidden",
            }
        ],
    }


POLICY_NAME = NODE_SWITCHES_POLICY_NAME
VALIDATION_ACTIONS = ["Deny"]
