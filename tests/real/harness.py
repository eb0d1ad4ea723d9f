"""The real tier's Pulumi workspace and helpers. What stands in for the nodes' kubelets (kwok) is started
with the control plane (tests/real/conftest.py)."""

from __future__ import annotations

import copy
import json
import os
import runpy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pulumi
from pulumi import automation as auto

from common.names import DEFAULT_PLUGIN_NAMESPACE, PROJECT, STACK_FILE_ENV
from common.tokens import Token
from e2e.build import LINKS
from e2e.controlplane import ApiError, ControlPlane
from offline.program import ProgramRun, run_program
from tests.real.conftest import TENANT, eventually
from tests.support.routes import ROUTES

T = TypeVar("T")
PROGRAM = Path(__file__).resolve().parents[2] / "__main__.py"
PLUGIN_NAMESPACE = DEFAULT_PLUGIN_NAMESPACE


class Stopwatch(dict[str, float]):
    """Wall seconds per step, for docs/performance.md: printed (pytest -s shows them) and written into
    the directory E2E_TIMES names, as <name>.json."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def timed(self, step: str, call: Callable[[], T]) -> T:
        started = time.monotonic()
        result = call()
        self[step] = round(time.monotonic() - started, 1)
        return result

    def record(self) -> None:
        print(dict(self))
        target = os.environ.get("E2E_TIMES")
        if target:
            Path(target).mkdir(parents=True, exist_ok=True)
            (Path(target) / f"{self.name}.json").write_text(json.dumps(self, indent=2) + "\n")


# Stack name -> its stack file: an inline program's file is in its workspace, not in stacks/.
STACK_FILES: dict[str, Path] = {}


def program() -> None:
    """This repository's __main__.py, as `pulumi up` runs it: an Automation API inline program, so no
    pulumi-language-python binary is needed (the module proxy serves none). The program compares what
    the CLI hands it with the stack file $HIDDEN_GPU_STACK_FILE names."""
    os.environ[STACK_FILE_ENV] = str(STACK_FILES[pulumi.get_stack()])
    runpy.run_path(str(PROGRAM), run_name="__main__")


def cli_env(work: Path) -> dict[str, str]:
    """The pinned CLI, provider and language hosts of e2e/.bin, a file backend in `work`, nothing downloaded."""
    (work / "state").mkdir(exist_ok=True)
    if not os.environ["PATH"].startswith(f"{LINKS}{os.pathsep}"):
        os.environ["PATH"] = f"{LINKS}{os.pathsep}{os.environ['PATH']}"
    return {
        "PULUMI_BACKEND_URL": f"file://{work / 'state'}",
        "PULUMI_HOME": str(work / "home"),
        "PULUMI_CONFIG_PASSPHRASE": "e2e",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PATH": os.environ["PATH"],
    }


def pulumi_stack(
    work: Path, name: str, *, own_project_file: bool = False, inline: Callable[[], None] = program
) -> auto.Stack:
    """A stack of this program in `work` (its Pulumi.<name>.yaml), with a file backend and a passphrase
    there, run by the pinned CLI and provider of e2e/.bin, nothing downloaded."""
    STACK_FILES[name] = work / f"Pulumi.{name}.yaml"
    env = cli_env(work)
    # own_project_file: the test wrote work/Pulumi.yaml itself (with project-level config, say).
    settings = None if own_project_file else auto.ProjectSettings(name=PROJECT, runtime="python")
    options = auto.LocalWorkspaceOptions(work_dir=str(work), env_vars=env, project_settings=settings)
    return auto.create_or_select_stack(stack_name=name, project_name=PROJECT, program=inline, opts=options)


def labels(plane: ControlPlane, node: str) -> dict[str, str]:
    """The node's labels as the API server has them now."""
    return dict(plane.request("GET", f"/api/v1/nodes/{node}")["metadata"].get("labels") or {})


def denial(plane: ControlPlane, obj: dict[str, Any], namespace: str = TENANT, identity: str = "tenant") -> str | None:
    """The API server's refusal of a dry-run create (by the tenant), or None when it admits it."""
    try:
        plane.create(with_namespace(obj, namespace), identity=identity, dry_run=True)
    except ApiError as error:
        return error.message
    return None


def with_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    placed = copy.deepcopy(obj)
    placed["metadata"]["namespace"] = namespace
    return placed


def rule_in(message: str | None) -> str:
    assert message is not None, "admitted"
    assert "hidden-gpu guard, rule " in message, message
    return message.split("hidden-gpu guard, rule ", 1)[1].split(":", 1)[0]


# Every RuntimeClass a route or benign pod names: the RuntimeClass admission plugin refuses a pod naming
# one that does not exist before any policy sees it.
CLASSES = {
    "nvidia": "nvidia",
    "nvidia-cdi": "nvidia",
    "nvidia-legacy": "nvidia",
    "nvidia-experimental": "nvidia-experimental",
    "my-gpu-runtime": "nvidia",
    "hidden-gpu-pool-shared": "nvidia",
    "gvisor": "runsc",
}
GUARD_KINDS = (Token.ADMISSION_POLICY, Token.ADMISSION_BINDING, Token.MUTATING_POLICY, Token.MUTATING_BINDING)


def guard_objects(run: ProgramRun) -> list[dict[str, Any]]:
    return [r.inputs for r in run.kubernetes_objects if r.type in GUARD_KINDS]


def apply_guard(plane: ControlPlane, config: dict[str, Any], probe: dict[str, Any] | None = None) -> ProgramRun:
    """The guard of this stack config, applied and in force: a known route (`probe`, by default a privileged pod) is
    denied before this returns."""
    run = run_program(config, "test")
    for obj in (r.inputs for r in run.kubernetes_objects if r.type == Token.RUNTIME_CLASS):
        plane.apply(obj)
    for obj in guard_objects(run):
        plane.apply(obj)
    probe = probe or ROUTES["privileged"][0]
    eventually(lambda: "hidden-gpu guard" in (denial(plane, probe, identity="admin") or ""), what="the guard in force")
    return run
