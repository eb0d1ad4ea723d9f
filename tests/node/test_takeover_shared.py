"""Replacing, node by node, the recipe most users wrote (issue 42, 4): one hand-made plugin DaemonSet serving every
GPU node by index (`NVIDIA_VISIBLE_DEVICES=0`, the k8s-device-plugin #236 and #81 threads), on a real kubelet.
The second node it serves is an API Node object with no kubelet (its pod is bound and never runs): what the test
shows of it is that it keeps its pod, untouched. The user's one edit of the hand-made DaemonSet (the node-affinity
term, `OnDelete`) restarts no pod; `up` with the node named `shared` labels the node, which moves the hand-made
pod off it, and the pinned plugin's init container holds it until the hand-made plugin's socket is gone. Sampled
from the API every 100 ms throughout, as tests/node/test_takeover.py is; docs/operations.md, "A DaemonSet that
serves several nodes", says what it shows."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from cluster.adoption import terms_staying
from common.names import KUBELET_DEVICE_PLUGINS, NODE_LABEL, PLUGIN_WAIT_CONTAINER, device_plugin_name, plugin_labels
from e2e.controlplane import ControlPlane
from e2e.images import PLUGIN
from e2e.node import Node
from e2e.node_gpus import Toolkit
from tests.node.conftest import (
    GPU,
    NODE,
    PLUGIN_NAMESPACE,
    SAMPLE_S,
    apply_render,
    clear_plugin_namespace,
    eventually,
    rendered_objects,
    stack,
)
from tests.node.test_takeover import registrations, report, sampled
from tests.support.stacks import EXPOSED

NAMESPACE = "kube-system"
NAME = "nvidia-device-plugin-by-index"
SELECTOR = {"name": NAME}
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=name%3D{NAME}"
DAEMONSET = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{NAME}"
OTHER = "gpu-node-02"  # an API object only: no kubelet
NO_KUBELET_TAINT = {"key": "hidden-gpu.test/no-kubelet", "effect": "NoSchedule"}
GPU_NODES = {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
LEAVES = {"key": NODE_LABEL, "operator": "DoesNotExist"}


def by_index(*, leaves: bool) -> dict[str, Any]:
    """The recipe as the threads write it: every GPU node, GPU 0 by index, every taint tolerated; with `leaves`, the
    user's one edit docs/operations.md asks for (the term in every nodeSelectorTerms entry, and OnDelete)."""
    term = {"matchExpressions": [GPU_NODES, LEAVES] if leaves else [GPU_NODES]}
    strategy = {"type": "OnDelete"} if leaves else {"type": "RollingUpdate"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": SELECTOR},
            "updateStrategy": strategy,
            "template": {
                "metadata": {"labels": SELECTOR},
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                        }
                    },
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": 15,
                    "automountServiceAccountToken": False,
                    "runtimeClassName": "nvidia",
                    "containers": [
                        {
                            "name": "nvidia-device-plugin-ctr",
                            "image": PLUGIN.name,
                            "imagePullPolicy": "Never",
                            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}],
                            # A plugin that goes slowly: the pinned pod is then usually made while the old socket is
                            # still there, the path its wait is for; what the test asserts holds either way.
                            "lifecycle": {"preStop": {"exec": {"command": ["/bin/sleep", "5"]}}},
                            "volumeMounts": [{"name": "device-plugin", "mountPath": KUBELET_DEVICE_PLUGINS}],
                        }
                    ],
                    "volumes": [{"name": "device-plugin", "hostPath": {"path": KUBELET_DEVICE_PLUGINS}}],
                },
            },
        },
    }


def plugin_pods_on_node(plane: ControlPlane) -> list[str]:
    pods = plane.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}")["items"]
    return [p["metadata"]["name"] for p in pods if any(c["image"] == PLUGIN.name for c in p["spec"]["containers"])]


def hand_pods(plane: ControlPlane) -> dict[str, dict[str, Any]]:
    """The hand-made DaemonSet's pods, by node."""
    return {p["spec"].get("nodeName", ""): p for p in plane.request("GET", PODS)["items"]}


@pytest.fixture(scope="module")
def shared_recipe(node_plane: ControlPlane, node: Node) -> Iterator[None]:
    node.toolkit(Toolkit())
    clear_plugin_namespace(node_plane)
    # An earlier module's hand-made plugin (tests/node/test_takeover.py) goes with its DaemonSet: none may be left
    # on the node, or the samples count it.
    eventually(lambda: plugin_pods_on_node(node_plane) == [], "no plugin pod left on the node")
    # The node as the recipe left it: the operator's plugin off by hand, none of hidden-gpu's labels (an earlier
    # module's stay otherwise).
    node_plane.request(
        "PATCH",
        f"/api/v1/nodes/{NODE}",
        {"metadata": {"labels": {NODE_LABEL: None, "nvidia.com/gpu.deploy.device-plugin": "false"}}},
        content_type="application/merge-patch+json",
    )
    node_plane.apply(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"},
        manager="gpu-operator",
    )
    other = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": OTHER, "labels": {"kubernetes.io/os": "linux"}},
             "spec": {"taints": [NO_KUBELET_TAINT]}}  # fmt: skip
    node_plane.request("POST", "/api/v1/nodes", other)
    # Room for pods, or the scheduler binds none there (a kubelet would report it).
    room = {"pods": "10", "cpu": "4", "memory": "8Gi"}
    node_plane.request(
        "PATCH",
        f"/api/v1/nodes/{OTHER}/status",
        {"status": {"capacity": room, "allocatable": room}},
        content_type="application/merge-patch+json",
    )
    node_plane.apply(by_index(leaves=False), manager="kubectl")

    def serving() -> bool:
        """Registered, by its own log: allocatable alone may still be an earlier module's plugin's."""
        pods = hand_pods(node_plane)
        here = f"{NAMESPACE}/{pods[NODE]['metadata']['name']}" if NODE in pods else ""
        if set(pods) == {NODE, OTHER} and registrations(node, {here}) == {here: 1} and node.allocatable() == 1:
            return True
        raise AssertionError((node.allocatable(), {n: p["status"].get("phase") for n, p in pods.items()}))

    eventually(serving, "the hand-made plugin advertises GPU 0 on the real node and has a pod bound to the other")
    yield
    node_plane.request("DELETE", DAEMONSET)
    for pod in node_plane.request("GET", PODS)["items"]:  # the other node's never ends without a kubelet: forced
        node_plane.request(
            "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}?gracePeriodSeconds=0"
        )
    node_plane.request("DELETE", f"/api/v1/nodes/{OTHER}")


def rendered(tmp_path: Path) -> list[dict[str, Any]]:
    config = copy.deepcopy(stack("envvar"))
    config["hidden-gpu:nodes"][0]["adoptDevicePlugin"] = {"namespace": NAMESPACE, "name": NAME, "shared": True}
    # The plugin's replacement alone: the pinned dcgm-exporter beside it is tests/node/test_pinned_operands.
    config["hidden-gpu:nodes"][0]["operands"] = {"dcgmExporter": False}
    return rendered_objects(tmp_path, "envvar", guard=False, config=config)


def pinned_pods(plane: ControlPlane) -> list[dict[str, Any]]:
    selector = ",".join(f"{k}={v}" for k, v in plugin_labels(NODE).items())
    path = f"/api/v1/namespaces/{PLUGIN_NAMESPACE}/pods?labelSelector={quote(selector)}"
    return list(plane.request("GET", path)["items"])


def pinned_serving(plane: ControlPlane, node: Node) -> bool:
    pods = [p for p in pinned_pods(plane) if not p["metadata"].get("deletionTimestamp")]
    ready = [p for p in pods if any(c.get("ready") for c in p["status"].get("containerStatuses", []))]
    done = len(pods) == 1 and len(ready) == 1 and NODE not in hand_pods(plane) and node.allocatable() == 1
    if not done:
        raise AssertionError(([(p["metadata"]["name"], p["status"]) for p in pods], node.allocatable()))
    return True


def test_the_node_leaves_the_shared_daemonset_without_a_second_plugin(
    node_plane: ControlPlane, node: Node, shared_recipe: None, tmp_path: Path
) -> None:
    before = {n: p["metadata"]["uid"] for n, p in hand_pods(node_plane).items()}
    # The user's one edit, as `kubectl apply --server-side` of the edited manifest: with OnDelete no pod restarts.
    node_plane.apply(by_index(leaves=True), manager="kubectl")
    assert terms_staying(node_plane.request("GET", DAEMONSET)) == []
    eventually(lambda: node_plane.request("GET", DAEMONSET)["status"].get("observedGeneration") == 2, "observed")
    assert {n: p["metadata"]["uid"] for n, p in hand_pods(node_plane).items()} == before
    assert node.allocatable() == 1

    objects = rendered(tmp_path)
    (plugin,) = [o for o in objects if o["kind"] == "DaemonSet"]
    assert (plugin["metadata"]["namespace"], plugin["metadata"]["name"]) == (PLUGIN_NAMESPACE, device_plugin_name(NODE))
    assert [c["name"] for c in plugin["spec"]["template"]["spec"]["initContainers"]] == [PLUGIN_WAIT_CONTAINER]
    # What `up` does, in the render's order (the DaemonSet may come before the node's label: the wait holds either way).
    samples = sampled(
        node_plane,
        lambda: apply_render(node_plane, objects),
        lambda: pinned_serving(node_plane, node),
        "the hand-made pod gone from the node, the pinned plugin Ready, 1 GPU allocatable",
    )
    report("shared", samples, node)
    assert max(gpus for _, gpus, _ in samples) <= 1, "allocatable rose above the exposed count"
    assert max(len(running) for _, _, running in samples) <= 1, "two plugin containers ran on the node at once"
    assert node.checkpoint().get("RegisteredDevices", {}).get(GPU) == [EXPOSED]
    (pinned,) = pinned_pods(node_plane)
    named = f"{PLUGIN_NAMESPACE}/{pinned['metadata']['name']}"
    assert registrations(node, {named}) == {named: 1}
    waited = node.logs(PLUGIN_NAMESPACE, pinned["metadata"]["name"], PLUGIN_WAIT_CONTAINER)
    print(f"the wait said: {waited}")
    assert "the pinned plugin starts" in waited[-1]
    # Node by node: the other node keeps the very pod it had.
    assert {n: p["metadata"]["uid"] for n, p in hand_pods(node_plane).items()} == {OTHER: before[OTHER]}
    zero = [t for t, gpus, _ in samples if gpus == 0]
    assert len(zero) * SAMPLE_S < 15, f"allocatable at 0 for {len(zero) * SAMPLE_S:.1f} s"


def test_the_pinned_plugin_waits_while_another_plugin_socket_is_there(
    node_plane: ControlPlane, node: Node, shared_recipe: None, tmp_path: Path
) -> None:
    """Driven, not sampled: a socket file no plugin serves (what a killed plugin leaves) holds the next pinned pod in
    its init container for as long as it is there, with the message that says what to do; once it goes, the plugin
    starts and registers."""
    apply_render(node_plane, rendered(tmp_path))
    eventually(lambda: pinned_serving(node_plane, node), "the pinned plugin serving")
    stale = Path(KUBELET_DEVICE_PLUGINS) / "nvidia-left-behind.sock"
    stale.touch()
    try:
        (old,) = pinned_pods(node_plane)
        node_plane.request("DELETE", f"/api/v1/namespaces/{PLUGIN_NAMESPACE}/pods/{old['metadata']['name']}")

        def held() -> bool:
            pods = [p for p in pinned_pods(node_plane) if p["metadata"]["name"] != old["metadata"]["name"]]
            init = [s for p in pods for s in p["status"].get("initContainerStatuses", []) if "running" in s["state"]]
            if len(pods) == 1 and init and node.allocatable() == 0:
                return True
            raise AssertionError(([p["status"] for p in pods], node.allocatable()))

        eventually(held, "the new pinned pod held in its init container, the GPU unhealthy")
        (new,) = [p for p in pinned_pods(node_plane) if p["metadata"]["name"] != old["metadata"]["name"]]
        eventually(lambda: len(node.logs(PLUGIN_NAMESPACE, new["metadata"]["name"], PLUGIN_WAIT_CONTAINER)) > 0, "log")
        said = node.logs(PLUGIN_NAMESPACE, new["metadata"]["name"], PLUGIN_WAIT_CONTAINER)
        assert f"waiting for {stale} to go" in said[0] and "delete it" in said[0], said
        # Still held seconds on: the file, not time, decides.
        time.sleep(5)
        assert held()
    finally:
        stale.unlink(missing_ok=True)
    eventually(lambda: pinned_serving(node_plane, node), "the pinned plugin serving once the file went")
    assert "the pinned plugin starts" in node.logs(PLUGIN_NAMESPACE, new["metadata"]["name"], PLUGIN_WAIT_CONTAINER)[-1]
