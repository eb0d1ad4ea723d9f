"""cluster.verify's checks of the guard's admission policies and bindings against what the program declares."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cluster.live import Check, Live
from common.names import VOID_POLICY_NAME
from desired.guard_rules import (
    VALIDATION_ACTIONS,
    namespace_selector,
    void_mutation,
    void_variables,
)
from desired.guard_settings import GuardSettings, PolicySpec
from desired.node_switches import MATCH as NODE_SWITCHES_MATCH
from desired.node_switches import POLICY_NAME as NODE_SWITCHES
from desired.node_switches import VALIDATION_ACTIONS as NODE_SWITCHES_ACTIONS
from desired.node_switches import policy_spec as node_switches_spec


def check_guard_policy(declared: PolicySpec, args: GuardSettings, live: Live) -> Iterator[Check]:
    """Every field of the policy and its binding that decides what is judged and what a failure does: a
    policy that fails open, matches other requests, exempts more namespaces, or a binding that warns or
    binds fewer namespaces, each named."""
    policy = live.policies.get(declared.name)
    what = f"ValidatingAdmissionPolicy {declared.name}"
    if policy is None:
        yield Check("cluster", what, "as declared", "<missing>")
    else:
        spec = policy.get("spec") or {}
        constraints = spec.get("matchConstraints") or {}
        rules_live = [
            {key: rule.get(key) for key in ("apiGroups", "apiVersions", "operations", "resources")}
            for rule in constraints.get("resourceRules") or []
        ]
        # The API server defaults an absent selector to {} (every namespace).
        selector = constraints.get("namespaceSelector") or None
        conditions = {c.get("name"): c.get("expression") for c in spec.get("matchConditions") or []}
        live_variables = [(v.get("name"), v.get("expression")) for v in spec.get("variables") or []]
        live_rules = [v.get("expression") for v in spec.get("validations") or []]
        fields = (
            ("failurePolicy", "Fail", str(spec.get("failurePolicy"))),
            ("matches", "as declared", same(rules_live, [declared.match])),
            (
                "matchConditions",
                "as declared",
                same(conditions, dict(declared.conditions)),
            ),
            ("namespaceSelector", "as declared", same(selector, namespace_selector(args))),
            ("variables", "as declared", same(live_variables, declared.variables)),
            ("rules", "as declared", same(live_rules, [r.expression for r in declared.rules])),
        )
        for field, expected, actual in fields:
            yield Check("cluster", f"{what} {field}", expected, actual)
    binding = live.bindings.get(declared.name)
    spec = (binding or {}).get("spec") or {}
    actions = spec.get("validationActions")
    yield Check(
        "cluster",
        f"binding {declared.name} actions",
        ",".join(VALIDATION_ACTIONS[args.mode]),
        ",".join(actions) if actions else "<missing>",
    )
    # Bound to this policy, everywhere it matches: a binding that names another policy or narrows its match binds less.
    if binding is None:
        bound = "<missing>"
    elif spec.get("policyName") != declared.name:
        bound = f"binds {spec.get('policyName')}"
    else:
        bound = "narrowed" if narrowed(spec) else "every namespace"
    yield Check("cluster", f"binding {declared.name} scope", "every namespace", bound)


def narrowed(binding_spec: dict[str, Any]) -> bool:
    """Whether a binding judges less than its policy matches: a binding without matchResources (or with the API
    server's defaults there) applies wherever the policy matches; any selector, or a paramRef, narrows it."""
    scope = {k: v for k, v in (binding_spec.get("matchResources") or {}).items() if v not in ({}, None, "Equivalent")}
    return bool(scope or binding_spec.get("paramRef"))


def same(live: object, declared: object) -> str:
    return "as declared" if live == declared else "differs"


def check_node_switches(live: Live) -> Iterator[Check]:
    """The node-switches policy as declared (what decides what it judges and how it fails) and bound to deny."""

    def essentials(spec: dict[str, Any]) -> tuple[object, ...]:
        rules = [
            {key: rule.get(key) for key in NODE_SWITCHES_MATCH}
            for rule in (spec.get("matchConstraints") or {}).get("resourceRules") or []
        ]
        checks = [v.get("expression") for v in spec.get("validations") or []]
        return spec.get("failurePolicy"), rules, spec.get("matchConditions"), spec.get("variables"), checks

    name = NODE_SWITCHES
    found = live.policies.get(name)
    actual = (
        "<missing>" if found is None else same(essentials(found.get("spec") or {}), essentials(node_switches_spec()))
    )
    yield Check("cluster", f"ValidatingAdmissionPolicy {name}", "as declared", actual)
    binding = (live.bindings.get(name) or {}).get("spec") or {}
    actions = binding.get("validationActions")
    expected = ",".join(NODE_SWITCHES_ACTIONS)
    yield Check("cluster", f"binding {name} actions", expected, ",".join(actions) if actions else "<missing>")
    # Bound to this policy, for every node: a binding that names another policy or narrows its match binds less.
    bound = (
        "<missing>"
        if not binding
        else ("every node" if binding.get("policyName") == name and not narrowed(binding) else "narrowed")
    )
    yield Check("cluster", f"binding {name} scope", "every node", bound)


def check_void_policy(live: Live) -> Iterator[Check]:
    policy = live.mutating_policies.get(VOID_POLICY_NAME)
    spec = (policy or {}).get("spec") or {}
    declared = [(v.get("name"), v.get("expression")) for v in spec.get("variables") or []] == void_variables() and [
        (m.get("applyConfiguration") or {}).get("expression") for m in spec.get("mutations") or []
    ] == [void_mutation()]
    actual = "as declared" if declared else ("<missing>" if policy is None else "mutation differs")
    yield Check("cluster", f"MutatingAdmissionPolicy {VOID_POLICY_NAME}", "as declared", actual)
    binding = live.mutating_bindings.get(VOID_POLICY_NAME)
    bound = ((binding or {}).get("spec") or {}).get("policyName")
    yield Check("cluster", f"binding {VOID_POLICY_NAME} policy", VOID_POLICY_NAME, bound or "<missing>")
