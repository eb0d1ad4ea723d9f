"""A node registered again, on the real kubelet (issue 32, 2): the Node object deleted and the kubelet restarted, as a
reinstall does. Read from the API server's watch, so the first version of the new Node is seen, whatever comes
after it:

- without the kubelet's `--node-labels`, the Node comes back without the switch: the GPU Operator would deploy its
  all-GPU plugin there until a repair re-applies it (docs/operations.md's windows);
- with `--node-labels` holding the switches and hidden-gpu's node label, the first version already has them: no
  window, and a tenant pod of the node's RuntimeClass (whose scheduling selects hidden-gpu's node label) runs on its
  allocated GPU with no repair.

Either way the plugin registers again once the kubelet's socket is created anew, and the node advertises the exposed
count again: a kubelet restart, on the real kubelet and the stand-in plugin."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from common.names import DEVICE_PLUGIN_LABEL, NODE_LABEL, PLUGIN_NAME
from desired.node_labels import node_labels
from e2e.controlplane import ControlPlane
from e2e.node import Node
from e2e.node_gpus import Toolkit
from stack_config.node_config import NodeConfig
from tests.node.conftest import (
    GPU,
    NODE,
    PLUGIN_NAMESPACE,
    apply_render,
    delete_pods,
    eventually,
    plugin_pod,
    probe_pod,
    rendered_objects,
    run_probe,
    seen,
)
from tests.support.stacks import EXPOSED

STRATEGY = "envvar"
# What docs/operations.md tells a platform team to put on a shared host's kubelet: everything the node patch sets
# for a node that exposes a GPU (every switch it holds off, and the node's own label).
NODE_LABELS = node_labels(NodeConfig.model_validate({"name": NODE, "exposedGpus": [EXPOSED]}))


@pytest.fixture(scope="module")
def deployed(node_plane: ControlPlane, node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    node.toolkit(Toolkit())
    apply_render(node_plane, rendered_objects(tmp_path_factory.mktemp("render"), STRATEGY, guard=False))
    eventually(lambda: plugin_pod(node_plane, STRATEGY), "the plugin pod Running")
    yield
    delete_pods(node_plane)


class FirstRegistration(threading.Thread):
    """The first version of the Node the API server hands a watch that starts while no Node of that name exists."""

    def __init__(self, plane: ControlPlane) -> None:
        super().__init__(daemon=True)
        self.plane = plane
        self.first: dict[str, Any] | None = None
        self.started = threading.Event()

    def run(self) -> None:
        path = f"/api/v1/nodes?watch=true&fieldSelector=metadata.name%3D{NODE}&timeoutSeconds=120"
        response = self.plane.stream(path)
        self.started.set()  # the answer's headers are in: the watch has started
        for line in response:
            event = json.loads(line)
            if event["type"] == "ADDED":
                self.first = event["object"]
                response.close()  # unread, its connection must not go back to the pool
                return


def register_again(plane: ControlPlane, node: Node, node_labels: dict[str, str] | None) -> dict[str, Any]:
    """Stop the kubelet, delete the Node, watch, start the kubelet (with `node_labels`); the new Node's first
    version."""
    watch = FirstRegistration(plane)

    def delete_node() -> None:
        plane.request("DELETE", f"/api/v1/nodes/{NODE}")
        eventually(lambda: plane.get_or_none(f"/api/v1/nodes/{NODE}") is None, "the Node gone")
        watch.start()
        assert watch.started.wait(10), "the watch did not start"

    node.restart_kubelet(node_labels, before=delete_node)
    watch.join(10)
    assert watch.first is not None, "no ADDED event"
    return watch.first


def plugin_pods(plane: ControlPlane) -> list[dict[str, Any]]:
    """The plugin DaemonSet's pods that are not being deleted."""
    selector = f"app.kubernetes.io/name%3D{PLUGIN_NAME}"
    pods = plane.request("GET", f"/api/v1/namespaces/{PLUGIN_NAMESPACE}/pods?labelSelector={selector}")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def unschedulable(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions", [])
    return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)


def advertised_again(node: Node) -> float:
    """Seconds until the plugin has registered again and the node advertises the exposed GPU."""
    started = time.monotonic()
    eventually(lambda: node.allocatable() == 1, "the plugin registered again: 1 GPU allocatable")
    assert node.checkpoint().get("RegisteredDevices", {}).get(GPU) == [EXPOSED]
    return time.monotonic() - started


def test_without_the_kubelet_flag_the_node_comes_back_unhidden_and_without_our_plugin(
    node_plane: ControlPlane, node: Node, deployed: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The switch is gone, so the operator's plugin would come; and ours cannot run: its pod's RuntimeClass schedules
    by hidden-gpu's node label (RuntimeClass admission copies it into the pod's nodeSelector), which went with the
    old Node, so the kubelet refuses the pod it had (NodeAffinity) and the new one stays Pending. The exposed GPU is
    not advertised until the repair puts the labels back."""
    (running,) = [p["metadata"]["name"] for p in plugin_pods(node_plane)]
    log_from = len(node.log("kubelet"))
    first = register_again(node_plane, node, None)
    labels = first["metadata"].get("labels", {})
    assert DEVICE_PLUGIN_LABEL not in labels and NODE_LABEL not in labels, labels

    def refused() -> bool:
        log = node.log("kubelet")[log_from:].splitlines()
        return any(running in line for line in log if "Predicate NodeAffinity failed" in line)

    def successors_pending() -> list[dict[str, Any]]:
        successors = [p for p in plugin_pods(node_plane) if p["metadata"]["name"] != running]
        return successors if successors and all(unschedulable(p) for p in successors) else []

    # Waited for, not slept on: the kubelet's admission, the DaemonSet controller and the scheduler each take a turn.
    eventually(refused, f"the kubelet refusing {running} (Predicate NodeAffinity failed)")
    eventually(successors_pending, "the plugin's successor pod Unschedulable")
    eventually(lambda: node.allocatable() == 0, "the node advertising no GPU")
    # The repair: what `up` after a refresh applies again (the node's label patch among the render's objects).
    apply_render(node_plane, rendered_objects(tmp_path_factory.mktemp("repair"), STRATEGY, guard=False))
    assert node.node()["metadata"]["labels"][DEVICE_PLUGIN_LABEL] == "false"
    print(f"without --node-labels: GPU advertised again {advertised_again(node):.1f} s after the repair")


def test_with_the_kubelet_flag_the_node_is_hidden_from_its_first_version(
    node_plane: ControlPlane, node: Node, deployed: None
) -> None:
    first = register_again(node_plane, node, NODE_LABELS)
    labels = first["metadata"].get("labels", {})
    assert {key: labels.get(key) for key in NODE_LABELS} == NODE_LABELS, labels
    print(f"with --node-labels: GPU advertised again {advertised_again(node):.1f} s after the kubelet was Ready")
    # No repair ran: the plugin and a tenant pod of the node's RuntimeClass find the node by hidden-gpu's node label.
    result = run_probe(node_plane, node, probe_pod("after-reregistration", gpus=1))
    assert result["pod"]["spec"]["nodeName"] == NODE
    assert seen(result["lines"]) == {EXPOSED}
