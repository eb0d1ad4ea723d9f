"""Run the real Pulumi program (__main__.py) under Pulumi's own mocks and record what it declares.

This is how the offline render, the tests and the benchmark see the program: no CLI, no cluster,
no provider plugin, but the same code path `pulumi up` takes up to the provider boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import tempfile
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from google.protobuf import json_format  # type: ignore[import-untyped]

from common.cli import interrupt_ends_process
from common.names import PROJECT, STACK_FILE_ENV
from offline.sdk import UNKNOWN, MockMonitor, reset_run_state, root_outputs, run_sync

PROGRAM = Path(__file__).resolve().parent.parent / "__main__.py"
# A collection threshold no run reaches.
NEVER = 1_000_000_000
# Pulumi's Output coroutines that a run leaves unstarted: made where no event loop was current (its
# ensure_future raises and drops the coroutine), or abandoned with a failed run. Harmless once the
# run is over, but each warns when collected, at a time that belongs to whatever runs next.
ABANDONED_OUTPUT = r"coroutine 'Output\."
# How long cancelled leftovers of a run may take to unwind.
UNWIND_SECONDS = 5


@dataclass(frozen=True)
class Declared:
    """One resource as the program registered it."""

    type: str
    name: str
    # What the mocks hold for it: its inputs. In a preview, where they answer nothing, the inputs as the program
    # sent them, each value it did not know as offline.sdk.UNKNOWN.
    inputs: dict[str, Any]
    parent: str
    dependencies: tuple[str, ...]
    provider: str
    urn: str
    retain_on_delete: bool = False
    protect: bool = False
    # URNs this resource was known by before (its aliases), so a rename with an alias keeps its identity.
    aliases: tuple[str, ...] = ()

    @property
    def is_kubernetes_object(self) -> bool:
        return self.type.startswith("kubernetes:")


@dataclass
class ProgramRun:
    resources: list[Declared] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    # (type, id) of every live object the program read (`get`), which it does not create.
    reads: list[tuple[str, str]] = field(default_factory=list)

    @property
    def kubernetes_objects(self) -> list[Declared]:
        return sorted((r for r in self.resources if r.is_kubernetes_object), key=lambda r: (r.type, r.name))

    def of_type(self, type_token: str) -> list[Declared]:
        return [r for r in self.resources if r.type == type_token]


class LiveObjectMissingError(Exception):
    """The program read a live object the simulated cluster does not have, as `pulumi preview` would fail."""


class PatchWithoutNameError(Exception):
    """A patch resource declared without a known `metadata.name`, which the Kubernetes provider's Check refuses, in
    a preview too (pulumi-kubernetes: "patch resources require the `.metadata.name` field to be set")."""


def _check_patch(request: Any) -> None:
    """What the provider's Check asks of a patch resource: a name. Here in the preview alone, where the program
    sends unknown values; an `up`'s are all known and the mocks hold them as sent."""
    if not (request.type.startswith("kubernetes:") and request.type.endswith("Patch")):
        return
    metadata = json_format.MessageToDict(request.object).get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name or name == UNKNOWN:
        raise PatchWithoutNameError(
            f"{request.type} {request.name}: patch resources require the `.metadata.name` field to be set"
        )


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self, live: Mapping[tuple[str, str], dict[str, Any]] | None, preview: bool = False) -> None:
        self._live = live
        self._preview = preview

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        if args.resource_id:  # a read (`get`): the live object, as the cluster holds it
            if self._live is None:
                return args.resource_id, {**args.inputs, "spec": {}}
            key = (args.typ, args.resource_id)
            if key not in self._live:
                raise LiveObjectMissingError(f"{args.typ} {args.resource_id} does not exist")
            return args.resource_id, dict(self._live[key])
        # Kubernetes reports the object back with its name; nothing else is computed. In a preview, as the
        # harshest engine would, nothing comes back: every output the program reads is unknown.
        return f"{args.name}-id", ({} if self._preview else dict(args.inputs))

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return {}, None


def _alias_urns(request: Any, urn: str) -> list[str]:
    """The URNs a registration's aliases stand for: given whole, or as a spec of what differs (name, type,
    parent) from the resource itself, resolved as the engine does (urn:pulumi:stack::project::types::name)."""
    prefix, _, rest = urn.partition("::")  # urn:pulumi:<stack>
    project, own_types, _own_name = rest.split("::", 2)
    found = []
    for alias in getattr(request, "aliases", []):
        if alias.urn:
            found.append(alias.urn)
            continue
        spec = alias.spec
        kind = spec.type or request.type
        if spec.noParent:
            types = kind
        else:
            parent = spec.parentUrn or request.parent
            types = f"{parent.split('::')[2]}${kind}" if parent and "::" in parent else kind
        stack = f"urn:pulumi:{spec.stack}" if spec.stack else prefix
        found.append(f"{stack}::{spec.project or project}::{types}::{spec.name or request.name}")
    del own_types
    return found


class _RecordingMonitor(MockMonitor):
    """Pulumi's mock monitor, also keeping parent and depends_on, which mocks do not see."""

    def __init__(self, run: ProgramRun, mocks: _Mocks, preview: bool) -> None:
        super().__init__(mocks)
        self._run = run
        self._preview = preview
        # The mock monitor answers on executor threads and gives each thread an event loop of its
        # own, which nobody closes: left to the collector at exit, a loop whose self-pipe socket
        # was finalised first prints "Exception ignored in BaseEventLoop.__del__". Kept to close.
        self.thread_loops: set[asyncio.AbstractEventLoop] = set()

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        if self._preview:
            _check_patch(request)
        try:
            response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        finally:  # a registration that fails has made its thread's loop all the same
            self._keep_thread_loop()
        if request.type != "pulumi:pulumi:Stack":
            self._run.resources.append(
                Declared(
                    type=request.type,
                    name=request.name,
                    inputs=self._inputs(request, response.urn),
                    parent=request.parent,
                    dependencies=tuple(request.dependencies),
                    provider=request.provider,
                    urn=response.urn,
                    retain_on_delete=bool(request.retainOnDelete),
                    protect=bool(request.protect),
                    aliases=tuple(_alias_urns(request, response.urn)),
                )
            )
        return response

    def _inputs(self, request: Any, urn: str) -> dict[str, Any]:
        if self._preview:
            sent: dict[str, Any] = json_format.MessageToDict(request.object)
            return sent
        return self.resources[urn].state if urn in self.resources else {}

    def ReadResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        try:
            response = super().ReadResource(request)  # type: ignore[no-untyped-call]
        finally:
            self._keep_thread_loop()
        self._run.reads.append((request.type, request.id))
        return response

    def _keep_thread_loop(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            with contextlib.suppress(RuntimeError):
                self.thread_loops.add(asyncio.get_event_loop_policy().get_event_loop())


@contextlib.contextmanager
def _own_event_loops(monitor: _RecordingMonitor) -> Iterator[None]:
    """A fresh event loop for the run, closed afterwards with every loop the mock monitor's threads
    made: what is closed is never finalised by the collector at interpreter exit. Whatever the run
    leaves behind is finished and collected here, not in whatever runs next."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    failed = False
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=ABANDONED_OUTPUT, category=RuntimeWarning)
        try:
            yield
        except BaseException as error:
            failed = True
            _release_frames(error)
            raise
        finally:
            # First let the executor's threads finish: after a failure some are still answering
            # registrations, and each may add its loop to thread_loops while it is read.
            loop.run_until_complete(loop.shutdown_default_executor())
            for each in (loop, *monitor.thread_loops):
                if failed:
                    # The run's own exception says what failed; the futures it abandoned would each
                    # add a "Future exception was never retrieved" when collected.
                    each.set_exception_handler(lambda _loop, _context: None)
                _finish_pending_tasks(each)
                if each is not loop and not each.is_closed() and not each.is_running():
                    each.close()
            loop.close()
            asyncio.set_event_loop(None)
            reset_run_state()
            # Older generations are not collected during a run (_young_collections_only), so all
            # of the run's garbage is in the two young ones.
            gc.collect(1)


def _release_frames(error: BaseException) -> None:
    """Let go of the locals in a failed run's tracebacks: through them the caller who keeps the
    exception would keep what the run abandoned (Outputs, coroutines), to be collected later,
    elsewhere. The lines of the traceback stay."""
    seen: set[int] = set()
    chain = [error]
    while chain:
        each = chain.pop()
        if id(each) in seen:
            continue
        seen.add(id(each))
        traceback.clear_frames(each.__traceback__)
        chain.extend(linked for linked in (each.__cause__, each.__context__) if linked is not None)
        if isinstance(each, BaseExceptionGroup):
            chain.extend(each.exceptions)


def _finish_pending_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks a run left pending on `loop` and let them unwind: a task dropped unstarted
    would warn that its coroutine was never awaited when the collector finds it."""
    if loop.is_closed() or loop.is_running():
        return
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=UNWIND_SECONDS))


@contextlib.contextmanager
def _young_collections_only() -> Iterator[None]:
    """Pulumi's runtime keeps every resource's futures alive until the run ends, and its Outputs
    leave cyclic garbage behind. Full collections rescan the growing heap of long-lived objects
    (superlinear runs); no collection lets the garbage pile up. Collecting only the youngest
    generation frees it while young and never rescans what the run keeps (docs/performance.md)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], NEVER, NEVER)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def run_program(
    config: Mapping[str, Any],
    stack: str,
    live: Mapping[tuple[str, str], dict[str, Any]] | None = None,
    *,
    preview: bool = False,
) -> ProgramRun:
    """Run __main__.py with a stack's `config:` map; raises whatever the program raises.

    `live` is the simulated cluster for the objects the program reads, keyed by (type token, id);
    without it every read finds an object that holds nothing of anyone else's."""

    code = compile(PROGRAM.read_text(), PROGRAM, "exec")

    # As `runpy.run_path(PROGRAM, run_name="__main__")` would run it, with fewer frames: the SDK
    # walks the whole stack at every registration to record where a resource was declared.
    def program() -> None:
        exec(code, {"__name__": "__main__", "__file__": str(PROGRAM)})

    with _as_its_stack_file(config):
        return run_callable(program, stack, config, live, preview=preview)


@contextlib.contextmanager
def _as_its_stack_file(config: Mapping[str, Any]) -> Iterator[None]:
    """The program checks what it was handed against the stack's file, as under the CLI: the file a config map was
    read from (render's), or one written from the map; $HIDDEN_GPU_STACK_FILE names it for the run (one run at a
    time in a process: Pulumi's run state is the process's too)."""
    with tempfile.TemporaryDirectory(prefix="hidden-gpu-stack-") as tmp:
        path = getattr(config, "path", None)
        if not isinstance(path, Path):
            path = Path(tmp) / "Pulumi.harness.yaml"
            path.write_text(yaml.safe_dump({"config": dict(config)}, sort_keys=False), encoding="utf-8")
        before = os.environ.get(STACK_FILE_ENV)
        os.environ[STACK_FILE_ENV] = str(path)
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(STACK_FILE_ENV, None)
            else:
                os.environ[STACK_FILE_ENV] = before


def run_callable(
    program: Callable[[], None],
    stack: str,
    config: Mapping[str, Any] | None = None,
    live: Mapping[tuple[str, str], dict[str, Any]] | None = None,
    *,
    preview: bool = False,
) -> ProgramRun:
    """Run any Pulumi program function under the mocks, recording what it declares; with `preview`, as
    `pulumi preview` runs it (is_dry_run() true, every resource output unknown)."""
    run = ProgramRun()
    mocks = _Mocks(live, preview)
    monitor = _RecordingMonitor(run, mocks, preview)

    async def resolve_outputs() -> None:
        run.outputs.update(await _resolved(root_outputs()))

    with interrupt_ends_process(), _own_event_loops(monitor), _young_collections_only():
        # Whatever ran Pulumi before (a `@pulumi.runtime.test`, say) may have left state behind.
        reset_run_state()
        pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=preview, monitor=monitor)
        # Pulumi hands a program structured config as JSON strings, plain strings as they are.
        pulumi.runtime.set_all_config(
            {key: value if isinstance(value, str) else json.dumps(value) for key, value in (config or {}).items()}
        )
        run_sync(program)
        run_sync(resolve_outputs)
    return run


async def _resolved(value: Any) -> Any:
    """An exported value with its Outputs awaited. Output.from_input would do it too, but it wraps
    every plain value of the export in an Output of its own, which costs at fleet size."""
    if isinstance(value, pulumi.Output):
        return await _resolved(await value.future())
    if isinstance(value, Mapping):
        return {key: await _resolved(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [await _resolved(item) for item in value]
    return value
