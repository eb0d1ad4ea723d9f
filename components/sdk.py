"""The non-public parts of the Pulumi Python SDK this project relies on, each behind one function.

Why each is needed:
- the whole config map: the public `pulumi.Config` reads one key at a time and cannot list keys,
  and the program must see every `hidden-gpu:` key to refuse a misspelt one;
- the root resource, a run function and a synchronous await: Pulumi's own mocks run a program
  only inside `@pulumi.runtime.test`; the offline render runs `__main__.py` as `pulumi up` would,
  outside pytest, and reads the stack's exports.
A Pulumi upgrade that changes any of them fails tests/test_sdk.py with the name of the symbol.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pulumi.runtime.config as _config
from pulumi.runtime import settings as _settings
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

T = TypeVar("T")

# (module, attribute) of each private symbol used here, for the shape test.
PRIVATE_SYMBOLS = (
    ("pulumi.runtime.config", "CONFIG"),
    ("pulumi.runtime.config", "get_config_env"),
    ("pulumi.runtime.settings", "ROOT"),
    ("pulumi.runtime.settings", "get_root_resource"),
    ("pulumi.runtime.mocks", "MockMonitor"),
    ("pulumi.runtime.stack", "run_pulumi_func"),
    ("pulumi.runtime.sync_await", "_sync_await"),
)

__all__ = ["MockMonitor", "full_config", "reset_root", "root_outputs", "run_sync"]


def full_config() -> dict[str, Any]:
    """Every config key the CLI handed the program: from PULUMI_CONFIG (older CLIs) and the
    language host's run request, the latter winning."""
    return _config.get_config_env() | _config.CONFIG.get()


def reset_root() -> None:
    """Forget the previous run's stack resource, so the next run registers a fresh one."""
    _settings.ROOT.set(None)


def root_outputs() -> dict[str, Any]:
    """What the program exported (`pulumi.export`), as registered on the stack resource."""
    outputs: dict[str, Any] = getattr(_settings.get_root_resource(), "outputs", {}) or {}
    return outputs


def run_sync(program: Callable[[], Awaitable[None] | None]) -> None:
    """Run a program function to completion, as the language host does, and wait for its RPCs."""
    _sync_await(run_pulumi_func(program))


def await_sync(awaitable: Awaitable[T]) -> T:
    return _sync_await(awaitable)
