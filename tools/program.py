"""Run the real Pulumi program (__main__.py) under Pulumi's own mocks and record what it declares.

This is how the offline render, the tests and the benchmark see the program: no CLI, no cluster,
no provider plugin, but the same code path `pulumi up` takes up to the provider boundary.
"""

from __future__ import annotations

import contextlib
import gc
import json
import runpy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from stack_config import PROJECT

PROGRAM = Path(__file__).resolve().parent.parent / "__main__.py"


@dataclass(frozen=True)
class Declared:
    """One resource as the program registered it."""

    type: str
    name: str
    inputs: dict[str, Any]
    parent: str
    dependencies: tuple[str, ...]
    provider: str
    urn: str

    @property
    def is_kubernetes_object(self) -> bool:
        return self.type.startswith("kubernetes:")


@dataclass
class ProgramRun:
    resources: list[Declared] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)

    @property
    def kubernetes_objects(self) -> list[Declared]:
        return sorted((r for r in self.resources if r.is_kubernetes_object), key=lambda r: (r.type, r.name))

    def of_type(self, type_token: str) -> list[Declared]:
        return [r for r in self.resources if r.type == type_token]


class _Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        # Kubernetes reports the object back with its name; nothing else is computed.
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return {}, None


class _RecordingMonitor(MockMonitor):
    """Pulumi's mock monitor, also keeping parent and depends_on, which mocks do not see."""

    def __init__(self, run: ProgramRun) -> None:
        super().__init__(_Mocks())
        self._run = run

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        if request.type != "pulumi:pulumi:Stack":
            self._run.resources.append(
                Declared(
                    type=request.type,
                    name=request.name,
                    inputs=self.resources[response.urn].state if response.urn in self.resources else {},
                    parent=request.parent,
                    dependencies=tuple(request.dependencies),
                    provider=request.provider,
                    urn=response.urn,
                )
            )
        return response


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pulumi's runtime keeps every resource's futures alive until the run ends; the cyclic
    collector rescanning that growing heap made a run superlinear in the number of resources."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def run_program(config: Mapping[str, Any], stack: str) -> ProgramRun:
    """Run __main__.py with a stack's `config:` map; raises whatever the program raises."""

    def program() -> None:
        runpy.run_path(str(PROGRAM), run_name="__main__")

    return run_callable(program, stack, config)


def run_callable(program: Callable[[], None], stack: str, config: Mapping[str, Any] | None = None) -> ProgramRun:
    """Run any Pulumi program function under the mocks, recording what it declares."""
    run = ProgramRun()
    pulumi_settings.ROOT.set(None)
    pulumi.runtime.set_mocks(_Mocks(), project=PROJECT, stack=stack, preview=False, monitor=_RecordingMonitor(run))
    # Pulumi hands a program structured config as JSON strings, plain strings as they are.
    pulumi.runtime.set_all_config(
        {key: value if isinstance(value, str) else json.dumps(value) for key, value in (config or {}).items()}
    )

    async def resolve_outputs() -> None:
        root = pulumi_settings.get_root_resource()
        exported = getattr(root, "outputs", {})
        run.outputs.update(await pulumi.Output.from_input(exported).future() or {})

    with _collector_paused():
        _sync_await(run_pulumi_func(program))
    _sync_await(run_pulumi_func(resolve_outputs))
    return run
