"""The access guard's fast path (desired/pod_checks.py, fast_path) is a shortcut and nothing more: generated pods
and `kubectl debug` updates get the same verdict and messages with it as with it switched off, and each of its checks
is needed (without any one of them a route of tests/support/routes.py gets past the rule it must meet, so a fast path
that misses a check fails here)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from desired import pod_checks
from desired.guard_settings import GuardSettings
from desired.pod_checks import FAST_PATH, container_checks, fast_path
from offline.program import ProgramRun
from stack_config.load import parse_project_config
from tests.support.examples import examples
from tests.support.guard import admit, pod_policy, rules_denying
from tests.support.pod_strategies import benign_pods, containers, pods
from tests.support.routes import ROUTES
from tests.support.stacks import valid_config

SETTINGS = GuardSettings.of(parse_project_config(valid_config()))
CHECKS = len(container_checks("c", SETTINGS, []))


def weakened(policy: dict[str, Any], podok: str) -> dict[str, Any]:
    out = copy.deepcopy(policy)
    (variable,) = [v for v in out["spec"]["variables"] if v["name"] == FAST_PATH]
    variable["expression"] = podok
    return out


def test_the_rendered_fast_path_is_the_one_built_here(run: ProgramRun) -> None:
    (variable,) = [v for v in pod_policy(run)["spec"]["variables"] if v["name"] == FAST_PATH]
    assert variable["expression"] == fast_path(SETTINGS)[1]


@pytest.mark.parametrize("index", range(CHECKS))
def test_each_fast_path_check_is_needed(run: ProgramRun, monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    every = pod_checks.container_checks

    def all_but_one(c: str, args: GuardSettings, capabilities: list[str]) -> list[str]:
        return [check for i, check in enumerate(every(c, args, capabilities)) if i != index]

    monkeypatch.setattr(pod_checks, "container_checks", all_but_one)
    policy = weakened(pod_policy(run), fast_path(SETTINGS)[1])
    escaped = next(
        (
            name
            for name, (obj, rule) in ROUTES.items()
            if rules_denying(policy, obj) != ([rule] if isinstance(rule, str) else rule)
        ),
        None,
    )
    assert escaped is not None, f"the fast path without check {index} still denies every route: a route is missing"


@pytest.fixture(scope="module")
def both(run: ProgramRun) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rendered pod policy, and the same with its fast path switched off (every rule judges alone)."""
    policy = pod_policy(run)
    return policy, weakened(policy, "false")


@settings(max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=st.one_of(pods(), benign_pods()))
def test_the_fast_path_changes_no_verdict_of_a_create(
    both: tuple[dict[str, Any], dict[str, Any]], pod: dict[str, Any]
) -> None:
    fast, alone = both
    assert admit(fast, pod) == admit(alone, pod), pod


@settings(max_examples=examples(800), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pod=st.one_of(pods(), benign_pods()),
    debugger=containers("debugger", ephemeral=True),
    earlier=containers("earlier", ephemeral=True),
)
def test_the_fast_path_changes_no_verdict_of_kubectl_debug(
    both: tuple[dict[str, Any], dict[str, Any]],
    pod: dict[str, Any],
    debugger: dict[str, Any],
    earlier: dict[str, Any],
) -> None:
    fast, alone = both
    old = copy.deepcopy(pod)
    old["spec"]["ephemeralContainers"] = [earlier]
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"].append(debugger)
    kwargs: dict[str, Any] = {"old": old, "sub_resource": "ephemeralcontainers"}
    assert admit(fast, new, **kwargs) == admit(alone, new, **kwargs), new
