"""`pulumi up` of a stack on the real node (issue 30): the real engine and provider create the program's objects, the
provider's DaemonSet await waits for the plugin pod the real kubelet runs, the kubelet then offers exactly the
exposed UUID, and a preview after has nothing to do. The stack names the stand-in plugin's image (imported on the
node, pull policy IfNotPresent as rendered), so nothing is substituted after the program. The guard it leaves
(retained on delete, by design) is removed by hand afterwards: the modules after this one run routes without it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from pulumi import automation as auto

from e2e.controlplane import ControlPlane
from e2e.images import DCGM_EXPORTER, PLUGIN
from e2e.node import Node
from e2e.node_gpus import Toolkit
from tests.node.conftest import (
    GPU,
    NODE,
    PLUGIN_NAMESPACE,
    clear_plugin_namespace,
    delete_guard,
    delete_pods,
    eventually,
    plugin_pod,
    stack,
)
from tests.real.harness import pulumi_stack
from tests.support.stacks import EXPOSED

STRATEGY = "envvar"


def pods_of_plugin(plane: ControlPlane) -> list[Any]:
    return list(plane.request("GET", f"/api/v1/namespaces/{PLUGIN_NAMESPACE}/pods")["items"])


@pytest.fixture(scope="module")
def upped(node_plane: ControlPlane, node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[auto.Stack]:
    node.toolkit(Toolkit())
    # The modules before applied the render by hand (another strategy, another field manager): this `up` starts
    # from a node without a plugin, as a first `up` does. Taking over a plugin someone else applied is adoption's.
    clear_plugin_namespace(node_plane)
    work = tmp_path_factory.mktemp("pulumi")
    config: dict[str, Any] = stack(STRATEGY)
    # The stand-ins' images, imported on the node (pulled IfNotPresent, as the render says).
    config["hidden-gpu:devicePlugin"]["image"] = PLUGIN.name
    config["hidden-gpu:devicePlugin"]["dcgmExporterImage"] = DCGM_EXPORTER.name
    config["kubernetes:kubeconfig"] = str(node_plane.kubeconfig("admin"))
    (work / "Pulumi.nodeup.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    deployed = pulumi_stack(work, "nodeup")
    deployed.up(on_output=None)
    yield deployed
    deployed.destroy(on_output=None)
    delete_pods(node_plane)
    delete_guard(node_plane, missing_ok=False)


def test_up_runs_the_plugin_on_the_real_kubelet(node_plane: ControlPlane, node: Node, upped: auto.Stack) -> None:
    pod = eventually(lambda: plugin_pod(node_plane, STRATEGY), "the plugin pod Running")
    assert pod["spec"]["containers"][0]["image"] == PLUGIN.name
    eventually(
        lambda: node.checkpoint().get("RegisteredDevices", {}).get(GPU) == [EXPOSED],
        "the checkpoint's RegisteredDevices = the exposed UUID",
    )
    # The node's status follows the checkpoint on the kubelet's own cadence.
    eventually(lambda: node.allocatable() == 1, "the node's allocatable nvidia.com/gpu = 1")
    assert node.node()["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] == "false"
    upped.preview(expect_no_changes=True)
    assert NODE in str(upped.outputs()["nodes"].value)


def test_up_took_the_stacks_state_not_a_hand_apply(upped: auto.Stack) -> None:
    exported = upped.export_stack().deployment
    assert exported is not None
    types = {r["type"] for r in exported["resources"]}
    assert {"kubernetes:apps/v1:DaemonSet", "kubernetes:core/v1:NodePatch"} <= types, types
