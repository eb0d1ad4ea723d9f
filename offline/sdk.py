"""The non-public parts of the Pulumi Python SDK this project relies on, each behind one function.

Why each is needed:
- the root resource, the run state, a run function and a synchronous await: Pulumi's own mocks run a program
  only inside `@pulumi.runtime.test`; the offline render runs `__main__.py` as `pulumi up` would,
  outside pytest, and reads the stack's exports;
- the sentinel an unknown value crosses to the engine as: what a preview's record shows where the program did not
  know a value, which the tests tell from an empty or absent one.
A Pulumi upgrade that changes any of them fails tests/test_rooms.py with the name of the symbol.

Here in the offline harness, used by nothing else: the program, the components and the Python distribution of
them (pyproject.toml) use the public SDK only (tests/test_rooms.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pulumi.runtime import settings as _settings
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.rpc import UNKNOWN
from pulumi.runtime.rpc_manager import RPCManager
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

T = TypeVar("T")

# (module, attribute) of each private symbol used here, for the shape test.
PRIVATE_SYMBOLS = (
    ("pulumi.runtime.settings", "ROOT"),
    ("pulumi.runtime.settings", "SETTINGS"),
    ("pulumi.runtime.rpc_manager", "RPCManager"),
    ("pulumi.runtime.settings", "get_root_resource"),
    ("pulumi.runtime.mocks", "MockMonitor"),
    ("pulumi.runtime.rpc", "UNKNOWN"),
    ("pulumi.runtime.stack", "run_pulumi_func"),
    ("pulumi.runtime.sync_await", "_sync_await"),
)

__all__ = ["UNKNOWN", "MockMonitor", "reset_run_state", "root_outputs", "run_sync"]


def reset_run_state() -> None:
    """Forget the previous run: its stack resource, and the outputs and RPCs it left pending. After
    a run that failed these still hold tasks of its (closed) event loop, and the next run would
    wait on them; `set_mocks` does not replace them."""
    _settings.ROOT.set(None)
    _settings.SETTINGS.outputs = set()
    _settings.SETTINGS.rpc_manager = RPCManager()  # type: ignore[no-untyped-call]


def root_outputs() -> dict[str, Any]:
    """What the program exported (`pulumi.export`), as registered on the stack resource."""
    outputs: dict[str, Any] = getattr(_settings.get_root_resource(), "outputs", {}) or {}
    return outputs


def run_sync(program: Callable[[], Awaitable[None] | None]) -> None:
    """Run a program function to completion, as the language host does, and wait for its RPCs."""
    _sync_await(run_pulumi_func(program))


def await_sync(awaitable: Awaitable[T]) -> T:
    return _sync_await(awaitable)
