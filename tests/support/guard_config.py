"""The valid stack with its `hidden-gpu:guard` set to chosen keys: the access guard's settings under test."""

from __future__ import annotations

from typing import Any

from tests.support.stacks import changed


def guard(**keys: Any) -> dict[str, Any]:
    return changed(lambda c: c.__setitem__("hidden-gpu:guard", keys))
