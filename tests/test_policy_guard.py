"""The policy pack's checks of the access guard, called directly with arguments built from rendered objects: every
shipped stack has its guard, present and failing closed; a program that drops or weakens it, or drops its claims or
node-switches policy, is refused, and the node-switches binding must deny whatever the mode; a stack listed in
policy/enforcing-stacks.yaml cannot switch its guard to warn, an unlisted one may, the first rollout in warn passes the
shipped pack, and a list that does not read fails the pack."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from pulumi_policy import StackValidationArgs
from pulumi_policy.policy import PolicyResource

from common.cli import stack_files
from common.names import CLAIMS_POLICY_NAME, ENV_KEYS_POLICY_NAME, NODE_SWITCHES_POLICY_NAME, POLICY_NAME
from common.tokens import Token
from offline import render
from offline.program import run_program
from policy import guard as policy_guard
from stack_config import read_stack_file
from tests.support.policy_pack import Collected, policy_resource
from tests.support.stacks import valid_config

STACK_FILES = stack_files()


def _guard_violations(resources: list[PolicyResource]) -> list[str]:
    from policy.guard import guard_present_and_failing_closed  # noqa: PLC0415

    found = Collected()
    guard_present_and_failing_closed(StackValidationArgs(resources), found)
    return list(found)


@pytest.mark.parametrize("stack_file", STACK_FILES, ids=[p.name for p in STACK_FILES])
def test_every_stack_has_its_guard(stack_file: Path) -> None:
    rendered = render.render(stack_file)
    assert _guard_violations([policy_resource(r) for r in rendered.run.resources]) == []


def test_a_program_that_drops_or_weakens_the_guard_is_refused() -> None:
    resources = [policy_resource(r) for r in run_program(valid_config(), "test").resources]
    without = [r for r in resources if r.resource_type != Token.ADMISSION_BINDING]
    assert _guard_violations(without) == [
        f"the access guard's binding {name} is missing"
        for name in ("hidden-gpu-access-guard", "hidden-gpu-env-keys", "hidden-gpu-claims", "hidden-gpu-node-switches")
    ]
    weakened = copy.deepcopy(resources)
    for r in weakened:
        if r.resource_type == Token.ADMISSION_POLICY:
            r.props["spec"]["failurePolicy"] = "Ignore"
        if r.resource_type == Token.ADMISSION_BINDING:
            r.props["spec"]["validationActions"] = ["Audit"]
            r.props["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {"x": "y"}}}
    assert len(_guard_violations(weakened)) == 12  # four policies: fail open, only audit, narrowed


@pytest.mark.parametrize("kind", [Token.ADMISSION_POLICY, Token.ADMISSION_BINDING])
@pytest.mark.parametrize("name", [CLAIMS_POLICY_NAME, NODE_SWITCHES_POLICY_NAME])
def test_the_pack_refuses_a_guard_without_its_claims_or_switches_policy(kind: str, name: str) -> None:
    """The pack checked the pods' and env keys' policies alone: a program that kept those and dropped the claims
    policy (a tenant's claim may then name a class of hidden GPUs) or the node switches' passed it."""
    resources = [policy_resource(r) for r in run_program(valid_config(), "test").resources]
    kept = [r for r in resources if not (r.resource_type == kind and r.props["metadata"]["name"] == name)]
    what = "policy" if kind == Token.ADMISSION_POLICY else "binding"
    assert _guard_violations(kept) == [f"the access guard's {what} {name} is missing"]


def test_the_node_switches_binding_must_deny_whatever_the_mode() -> None:
    resources = [policy_resource(r) for r in run_program(valid_config(), "test").resources]
    for r in resources:
        if r.resource_type == Token.ADMISSION_BINDING and r.props["metadata"]["name"] == NODE_SWITCHES_POLICY_NAME:
            r.props["spec"]["validationActions"] = ["Audit", "Warn"]
    assert _guard_violations(resources) == [
        f"binding {NODE_SWITCHES_POLICY_NAME}: validationActions ['Audit', 'Warn']: it must deny"
    ]


def _enforcing_violations(resources: list[PolicyResource]) -> list[str]:
    from policy.guard import guard_enforcing_where_listed  # noqa: PLC0415

    found = Collected()
    guard_enforcing_where_listed(StackValidationArgs(resources), found)
    return list(found)


def test_a_listed_stack_cannot_switch_its_guard_to_warn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prod listed in policy/enforcing-stacks.yaml (rollout step 4): its stack file setting `mode: warn` fails the
    preview (the base commit's pack judges the PR, so the list cannot be shortened in the same change)."""
    listed = tmp_path / "enforcing-stacks.yaml"
    listed.write_text("stacks: [prod]\n")
    monkeypatch.setattr(policy_guard, "ENFORCING_STACKS_FILE", listed)
    prod = STACK_FILES[[p.name for p in STACK_FILES].index("Pulumi.prod.yaml")]
    rendered = render.render(prod)
    assert _enforcing_violations([policy_resource(r) for r in rendered.run.resources]) == []
    warned = {**read_stack_file(prod), "hidden-gpu:guard": {"mode": "warn"}}
    said = _enforcing_violations([policy_resource(r) for r in run_program(warned, "prod").resources])
    assert said == [
        f"stack prod is listed in policy/enforcing-stacks.yaml: binding {name} must deny (validationActions "
        "['Deny'], guard mode enforce), not ['Audit', 'Warn']"
        for name in (POLICY_NAME, ENV_KEYS_POLICY_NAME, CLAIMS_POLICY_NAME)
    ]


def test_the_first_rollout_in_warn_passes_the_shipped_pack() -> None:
    """issue 42, 2: the README rolls the guard out in warn, and the shipped list named prod: prod in warn failed the
    pack until a pull request unlisted it, which no doc said. The list ships empty (rollout step 4 fills it)."""
    prod = STACK_FILES[[p.name for p in STACK_FILES].index("Pulumi.prod.yaml")]
    warned = {**read_stack_file(prod), "hidden-gpu:guard": {"mode": "warn"}}
    assert _enforcing_violations([policy_resource(r) for r in run_program(warned, "prod").resources]) == []


def test_an_unlisted_stack_may_warn() -> None:
    """dev rolls out in warn mode (its stack file says so), and is not listed."""
    dev = STACK_FILES[[p.name for p in STACK_FILES].index("Pulumi.dev.yaml")]
    rendered = render.render(dev)
    assert rendered.stack.guard.mode == "warn"
    assert _enforcing_violations([policy_resource(r) for r in rendered.run.resources]) == []


@pytest.mark.parametrize("text", ["stacks: prod\n", "stacks: [1]\n", "{}\n"], ids=["a-string", "a-number", "no-key"])
def test_an_enforcing_list_that_does_not_read_fails_the_pack(tmp_path: Path, text: str) -> None:
    from policy.guard import enforcing_stacks  # noqa: PLC0415

    (tmp_path / "enforcing.yaml").write_text(text)
    with pytest.raises(ValueError, match="`stacks` must be a list of stack names"):
        enforcing_stacks(tmp_path / "enforcing.yaml")
