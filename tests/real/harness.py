"""The real tier's stand-in for what it cannot run, and its Pulumi workspace.

No container runtime runs here, so FakeKubelet reports what the kubelets of the fixture nodes would:
pods bound there Running and Ready, deleted ones gone once "stopped", and nvidia.com/gpu capacity as the
device plugin on the node advertises it (the kubelet's device manager does that once the plugin
registers; without one, none). Everything else is the real thing.
"""

from __future__ import annotations

import copy
import json
import os
import runpy
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pulumi
from pulumi import automation as auto

from common.names import DEFAULT_PLUGIN_NAMESPACE, PLUGIN_NAME, PLUGIN_NAME_LABEL, PROJECT, STACK_FILE_ENV
from e2e.build import LINKS
from e2e.controlplane import ApiError, ControlPlane
from tests.real.conftest import TENANT

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


class FakeKubelet(threading.Thread):
    """What the kubelets of the two fixture nodes would report: pods bound there Running and Ready, deleted
    ones gone once "stopped", and nvidia.com/gpu capacity as the plugin on the node advertises it."""

    def __init__(self, plane: ControlPlane, nodes: list[str]) -> None:
        super().__init__(daemon=True)
        self.plane = plane
        self.nodes = nodes
        self.stopping = threading.Event()

    def __enter__(self) -> FakeKubelet:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.join()

    def run(self) -> None:
        while not self.stopping.wait(0.3):
            try:
                self.report()
            except (ApiError, OSError):  # a refusal, or an API server a test has killed
                continue

    def report(self) -> None:
        plugins: dict[str, int] = {}
        for pod in self.plane.request("GET", "/api/v1/pods")["items"]:
            spec, status, meta = pod["spec"], pod.get("status", {}), pod["metadata"]
            if not spec.get("nodeName"):
                continue
            if meta.get("deletionTimestamp"):  # containers stopped: the kubelet removes the pod for good
                self.plane.request(
                    "DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", {"gracePeriodSeconds": 0}
                )
                continue
            env = {e["name"]: e.get("value", "") for e in spec["containers"][0].get("env", [])}
            if "NVIDIA_VISIBLE_DEVICES" in env and meta.get("labels", {}).get(PLUGIN_NAME_LABEL) == PLUGIN_NAME:
                plugins[spec["nodeName"]] = len(env["NVIDIA_VISIBLE_DEVICES"].split(","))
            if status.get("phase") == "Running":
                continue
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            ready = {"status": "True", "lastTransitionTime": now}
            self.plane.request(
                "PATCH",
                f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}/status",
                {
                    "status": {
                        "phase": "Running",
                        "startTime": now,
                        "conditions": [{"type": t, **ready} for t in ("Initialized", "ContainersReady", "Ready")],
                        "containerStatuses": [
                            {
                                "name": c["name"],
                                "image": c["image"],
                                "imageID": "",
                                "ready": True,
                                "started": True,
                                "restartCount": 0,
                                "state": {"running": {"startedAt": now}},
                            }
                            for c in spec["containers"]
                        ],
                    }
                },
                content_type="application/merge-patch+json",
            )
        for node in self.nodes:
            gpus = str(plugins.get(node, 0))
            live = self.plane.request("GET", f"/api/v1/nodes/{node}")["status"]["capacity"].get("nvidia.com/gpu")
            if live != gpus:
                self.plane.request(
                    "PATCH",
                    f"/api/v1/nodes/{node}/status",
                    {"status": {"capacity": {"nvidia.com/gpu": gpus}, "allocatable": {"nvidia.com/gpu": gpus}}},
                    content_type="application/merge-patch+json",
                )


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
