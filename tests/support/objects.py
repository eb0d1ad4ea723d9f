"""Reading what the program declared: one resource of a kind, a container's env."""

from __future__ import annotations

from typing import Any

from offline.program import Declared


def only(resources: list[Declared]) -> Declared:
    assert len(resources) == 1, [r.name for r in resources]
    return resources[0]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}
