"""A 100-node stack through the real engine and control plane: `pulumi up` creates a pinned plugin per
node, the real DaemonSet controller and scheduler put each pod on its own node, kwok (the nodes' kubelets, the
stand-in: a hundred real ones would not fit CI) runs it, a second preview shows no change, destroy leaves every
node hidden. Times go to docs/performance.md (E2E_TIMES)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi.automation import OpType

from common.names import DEVICE_PLUGIN_LABEL, INSTANCE_LABEL
from e2e.controlplane import ControlPlane
from offline.bench import synthetic_stack
from tests.real.conftest import add_gpu_nodes, eventually
from tests.real.harness import Stopwatch, pulumi_stack

NODES = 100
FLEET_NAMESPACE = "hidden-gpu-fleet"


@pytest.fixture(scope="module")
def fleet(plane: ControlPlane) -> list[str]:
    config = synthetic_stack(NODES)
    names = [n["name"] for n in config["hidden-gpu:nodes"]]
    add_gpu_nodes(plane, dict.fromkeys(names, 8))
    return names


# Adding the fleet, up, preview and destroy of 100 nodes: about 100 s on a 2-core runner.
def all_placed(plane: ControlPlane, path: str) -> list[dict[str, Any]]:
    """The pods at `path` once there is one per node."""
    pods: list[dict[str, Any]] = plane.request("GET", path)["items"]
    return pods if len(pods) == NODES else []


@pytest.mark.timeout(900)
def test_a_hundred_nodes(plane: ControlPlane, fleet: list[str], tmp_path: Path) -> None:
    config: dict[str, Any] = synthetic_stack(NODES)
    # One DaemonSet per node, the shape of docs/performance.md's table: the pinned exporter (the default) doubles
    # what the engine awaits and CI's time with it, and scale adds nothing to it that the other tests do not run.
    for node in config["hidden-gpu:nodes"]:
        node["operands"] = {"dcgmExporter": False}
    config |= {
        "kubernetes:kubeconfig": str(plane.kubeconfig("admin")),
        "kubernetes:context": "admin@e2e",
        "hidden-gpu:quotas": {"ml-training": 8},
        # The lifecycle test's stack keeps its (retained) plugin namespace; this one has its own.
        "hidden-gpu:devicePlugin": {"namespace": FLEET_NAMESPACE},
    }
    (tmp_path / "Pulumi.fleet.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    stack = pulumi_stack(tmp_path, "fleet")
    times = Stopwatch("scale")
    up = times.timed(f"up, {NODES} nodes", stack.up)
    assert (up.summary.resource_changes or {}).get(OpType.CREATE, 0) >= 4 * NODES
    # Each node's plugin on that node alone, and no other pod in the namespace.
    path = f"/api/v1/namespaces/{FLEET_NAMESPACE}/pods?labelSelector=app.kubernetes.io/name%3Dnvidia-device-plugin"
    pods = eventually(partial(all_placed, plane, path), what=f"{NODES} plugin pods")
    assert sorted((p["metadata"]["labels"][INSTANCE_LABEL], p["spec"]["nodeName"]) for p in pods) == [
        (n, n) for n in fleet
    ]
    assert all(p["status"].get("phase") == "Running" for p in pods)  # kwok ran them, as `up`'s await needed
    assert len(plane.request("GET", f"/api/v1/namespaces/{FLEET_NAMESPACE}/pods")["items"]) == NODES
    times.timed(f"preview, {NODES} nodes, no change", lambda: stack.preview(expect_no_changes=True))
    times.timed(f"destroy, {NODES} nodes", stack.destroy)
    hidden = [
        n
        for n in fleet
        if plane.request("GET", f"/api/v1/nodes/{n}")["metadata"]["labels"].get(DEVICE_PLUGIN_LABEL) == "false"
    ]
    assert hidden == fleet
    times.record()
