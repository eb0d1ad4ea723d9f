from __future__ import annotations

from typing import Any

import pytest

from tests.stacks import valid_config
from tools.program import Declared, ProgramRun, run_program


@pytest.fixture(scope="module")
def run() -> ProgramRun:
    return run_program(valid_config(), "test")


def only(resources: list[Declared]) -> Declared:
    assert len(resources) == 1, [r.name for r in resources]
    return resources[0]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}
