"""The guard's policies, as plain validators: a stack keeps its whole guard, failing closed, and the stacks
policy/enforcing-stacks.yaml lists deny."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pulumi_policy import (
    ReportViolation,
    StackValidationArgs,
)

from common.names import CLAIMS_POLICY_NAME, ENV_KEYS_POLICY_NAME, NODE_SWITCHES_POLICY_NAME, POLICY_NAME
from common.tokens import Token

# The guard's policies whose bindings follow its mode (the node switches' always deny).
GUARD_POLICIES = (POLICY_NAME, ENV_KEYS_POLICY_NAME, CLAIMS_POLICY_NAME)


def _named(resources: list[Any], resource_type: str) -> dict[str, Any]:
    return {str((r.props.get("metadata") or {}).get("name")): r for r in resources if r.resource_type == resource_type}


def guard_present_and_failing_closed(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    """Every admission policy of the guard (pods, env keys, claims; node switches) and its binding, failing closed
    and bound to every namespace; each of the three binding either denying or warning and auditing, as the guard's
    mode says, the node switches' always denying: never a stack without a guard, one that only logs, or one that
    keeps the pods' policy and drops the claims' (a tenant's claim could then name a class of hidden GPUs)."""
    policies, bindings = _named(args.resources, Token.ADMISSION_POLICY), _named(args.resources, Token.ADMISSION_BINDING)
    for name in (*GUARD_POLICIES, NODE_SWITCHES_POLICY_NAME):
        policy, binding = policies.get(name), bindings.get(name)
        if policy is None or binding is None:
            report_violation(f"the access guard's {'policy' if policy is None else 'binding'} {name} is missing", None)
            continue
        if (policy.props.get("spec") or {}).get("failurePolicy") != "Fail":
            report_violation(f"ValidatingAdmissionPolicy {name} must fail closed (failurePolicy: Fail)", policy.urn)
        spec = binding.props.get("spec") or {}
        actions = sorted(spec.get("validationActions") or [])
        if name == NODE_SWITCHES_POLICY_NAME and actions != ["Deny"]:
            report_violation(f"binding {name}: validationActions {actions}: it must deny", binding.urn)
        elif actions not in (["Deny"], ["Audit", "Warn"]):
            report_violation(
                f"binding {name}: validationActions {actions} neither deny nor warn and audit", binding.urn
            )
        scope = {k: v for k, v in (spec.get("matchResources") or {}).items() if v not in ({}, None, "Equivalent")}
        if scope:
            report_violation(
                f"binding {name} is narrowed ({', '.join(sorted(scope))}): it must bind every namespace", binding.urn
            )


ENFORCING_STACKS_FILE = Path(__file__).resolve().parent / "enforcing-stacks.yaml"


def enforcing_stacks(path: Path | None = None) -> frozenset[str]:
    """The stacks policy/enforcing-stacks.yaml lists. A file that does not read as a list of names fails the
    preview (the pack's own error), rather than judging every stack as one that may warn."""
    path = path or ENFORCING_STACKS_FILE
    listed = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("stacks")
    if not isinstance(listed, list) or not all(isinstance(name, str) for name in listed):
        raise ValueError(f"{path}: `stacks` must be a list of stack names, not {listed!r}")
    return frozenset(listed)


def _stack_of(urn: str) -> str:
    """The stack a URN names: urn:pulumi:<stack>::<project>::<type>::<name>."""
    return urn.split("::", 1)[0].removeprefix("urn:pulumi:")


def guard_enforcing_where_listed(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    """A stack policy/enforcing-stacks.yaml lists must deny: its stack file cannot switch the guard to warn or
    audit, nor a broken program bind it so, without the list changing first."""
    stacks = {_stack_of(r.urn) for r in args.resources if r.urn.startswith("urn:pulumi:")}
    listed = sorted(stacks & enforcing_stacks())
    if not listed:
        return
    bindings = _named(args.resources, Token.ADMISSION_BINDING)
    for name in GUARD_POLICIES:
        binding = bindings.get(name)
        actions = sorted(((binding.props.get("spec") or {}) if binding else {}).get("validationActions") or [])
        if actions != ["Deny"]:
            report_violation(
                f"stack {listed[0]} is listed in policy/enforcing-stacks.yaml: binding {name} must deny "
                f"(validationActions ['Deny'], guard mode enforce), not {actions}",
                binding.urn if binding else None,
            )
