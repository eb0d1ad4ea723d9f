"""Reading what the program declared: one resource of a kind, a container's env."""

from __future__ import annotations

from typing import Any

from common.tokens import Token
from offline.program import Declared, ProgramRun


def only(resources: list[Declared]) -> Declared:
    assert len(resources) == 1, [r.name for r in resources]
    return resources[0]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """The container's plain variables (those set from a field, `valueFrom`, have no value to compare)."""
    return {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}


def plugins(run: ProgramRun) -> list[Declared]:
    """The device-plugin DaemonSets the program declared, not the pinned operands beside them."""
    return [d for d in run.of_type(Token.DAEMONSET) if d.name.endswith("-device-plugin")]
