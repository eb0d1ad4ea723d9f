"""The guard's admission policies and bindings as plain Kubernetes objects, from desired/guard_rules.py's specs and
desired/node_switches.py's: AccessGuard places them as retained resources."""

from __future__ import annotations

from common.names import (
    PART_OF,
    PART_OF_LABEL,
    VOID_POLICY_NAME,
)
from desired import node_switches
from desired.guard_rules import (
    POD_RESOURCES,
    denial,
    namespace_selector,
    nvidia_runtime,
    resource_rule,
    void_mutation,
    void_variables,
)
from desired.guard_settings import GuardSettings, PolicySpec
from desired.pods import TAKEN_BACK, Object, fields

RULE_FIELDS = ("apiGroups", "apiVersions", "operations", "resources")


def metadata(name: str) -> Object:
    """Retained on delete, so a later `up` (this stack's or a new one's) must take the objects back: one well-known
    field manager, forcing over whoever changed them meanwhile."""
    return {"name": name, "labels": {PART_OF_LABEL: PART_OF}, "annotations": TAKEN_BACK}


def _rule(rule: dict[str, list[str]]) -> Object:
    return {key: rule[key] for key in RULE_FIELDS}


def _match(rule: dict[str, list[str]], settings: GuardSettings) -> Object:
    """What this resource rule matches, in every namespace but the exempt ones (by name or label)."""
    return {"namespaceSelector": namespace_selector(settings), "resourceRules": [_rule(rule)]}


def _variables(named: list[tuple[str, str]]) -> list[Object]:
    return [{"name": name, "expression": expression} for name, expression in named]


def validating_policy(spec: PolicySpec, settings: GuardSettings) -> Object:
    """One of the guard's three ValidatingAdmissionPolicies: fail closed, every denial naming its rule."""
    body = fields(
        failurePolicy="Fail",
        matchConstraints=_match(spec.match, settings),
        matchConditions=_variables(spec.conditions) or None,
        variables=_variables(spec.variables) or None,
        validations=[
            {"expression": rule.expression, "message": denial(rule), "reason": "Forbidden"} for rule in spec.rules
        ],
    )
    return {"metadata": metadata(spec.name), "spec": body}


def node_switches_policy() -> Object:
    """The policy that holds a hidden node's switches off against every other writer."""
    spec = node_switches.policy_spec()
    body = {
        **spec,
        "matchConstraints": {"resourceRules": [_rule(r) for r in spec["matchConstraints"]["resourceRules"]]},
        "validations": [fields(**check) for check in spec["validations"]],
    }
    return {"metadata": metadata(node_switches.POLICY_NAME), "spec": body}


def void_policy(settings: GuardSettings) -> Object:
    """The MutatingAdmissionPolicy that adds NVIDIA_VISIBLE_DEVICES=void where the pod rules would deny a container
    for want of a request (`guard.addVoid`)."""
    body = {
        "failurePolicy": "Fail",
        # A sidecar a webhook injects after this policy ran gets its void on the second pass.
        "reinvocationPolicy": "IfNeeded",
        "matchConstraints": _match(resource_rule(POD_RESOURCES), settings),
        "matchConditions": [{"name": "nvidia-runtime", "expression": nvidia_runtime(settings)}],
        "variables": _variables(void_variables()),
        "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": void_mutation()}}],
    }
    return {"metadata": metadata(VOID_POLICY_NAME), "spec": body}


def binding(name: str, policy_name: object, actions: list[str] | None = None) -> Object:
    """The binding of the policy `name`, to every namespace the policy matches; `policy_name` placed as given (a
    component's Output of the policy, so the binding waits for it). No actions for a mutating policy's binding."""
    return {"metadata": metadata(name), "spec": fields(policyName=policy_name, validationActions=actions)}
