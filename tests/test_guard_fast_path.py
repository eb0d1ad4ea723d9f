"""The access guard's fast path (components/pod_checks.py, fast_path) is a shortcut and nothing more: the routes and
benign pods of tests/test_access_guard.py keep every verdict through it, and each of its checks is needed. Without
any one of them a route of tests/support/routes.py gets past the rule it must meet, so a fast path that misses a
check, or a rule added without its check, fails here."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from components import pod_checks
from components.guard_settings import GuardSettings
from components.pod_checks import FAST_PATH, container_checks, fast_path
from offline.program import ProgramRun
from stack_config.load import parse_project_config
from tests.support.guard import pod_policy, rules_denying
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
