"""Hardened toolkit (accept-nvidia-visible-devices-envvar-when-unprivileged = false, as-volume-mounts = true)
with the stack's plugin on DEVICE_LIST_STRATEGY=volume-mounts: the plugin gets its own GPU through the /dev/null
mount the render gives it, an allocated pod sees its GPU, and the variable and zero-request routes see nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from e2e.controlplane import ControlPlane
from e2e.node import Node
from e2e.node_gpus import HARDENED
from tests.node.conftest import (
    GPU,
    allocated,
    apply_render,
    delete_pods,
    eventually,
    plugin_pod,
    probe_pod,
    rendered_objects,
    run_probe,
    seen,
)
from tests.support.stacks import EXPOSED, HIDDEN

Pod = dict[str, Any]
STRATEGY = "volume-mounts"
REQUEST_DIR = "/var/run/nvidia-container-devices"


@pytest.fixture(scope="module")
def deployed(node_plane: ControlPlane, node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    node.toolkit(HARDENED)
    apply_render(node_plane, rendered_objects(tmp_path_factory.mktemp("render"), STRATEGY, guard=False))
    pod = eventually(lambda: plugin_pod(node_plane, STRATEGY), "the volume-mounts plugin pod Running")
    yield pod
    delete_pods(node_plane)


def test_the_plugin_gets_its_gpu_through_the_rendered_mount(node: Node, deployed: Pod) -> None:
    (container,) = deployed["spec"]["containers"]
    assert f"{REQUEST_DIR}/{EXPOSED}" in {m["mountPath"] for m in container["volumeMounts"]}
    eventually(
        lambda: node.checkpoint().get("RegisteredDevices", {}).get(GPU) == [EXPOSED],
        "the checkpoint's RegisteredDevices = the exposed UUID",
    )
    eventually(lambda: node.allocatable() == 1, "allocatable nvidia.com/gpu = 1")


def test_an_allocated_pod_sees_its_gpu(node_plane: ControlPlane, node: Node, deployed: Pod) -> None:
    eventually(lambda: node.checkpoint().get("RegisteredDevices", {}).get(GPU) == [EXPOSED], "the plugin registered")
    result = run_probe(node_plane, node, probe_pod("one-gpu", gpus=1))
    given = allocated(node, result["pod"])
    assert given == [EXPOSED]
    assert seen(result["lines"]) == set(given)
    # The plugin answered as NVIDIA's does for volume-mounts: the directory in the variable, one /dev/null per GPU.
    assert f"env NVIDIA_VISIBLE_DEVICES={REQUEST_DIR}" in result["lines"]
    assert f"request {EXPOSED}" in result["lines"]
    delete_pods(node_plane)


def test_the_variable_and_zero_request_routes_see_nothing(node_plane: ControlPlane, node: Node, deployed: Pod) -> None:
    zero = run_probe(node_plane, node, probe_pod("zero-gpus", gpus=0))
    assert zero["pod"]["status"]["phase"] != "Failed", zero["pod"]["status"]
    assert "env NVIDIA_VISIBLE_DEVICES=all" in zero["lines"]  # the image's ENV reached the container...
    assert seen(zero["lines"]) == set()  # ...and the toolkit ignored it
    env = run_probe(node_plane, node, probe_pod("env-hidden", env={"NVIDIA_VISIBLE_DEVICES": HIDDEN[0]}))
    assert f"env NVIDIA_VISIBLE_DEVICES={HIDDEN[0]}" in env["lines"]
    assert seen(env["lines"]) == set()
    void = run_probe(node_plane, node, probe_pod("env-void", env={"NVIDIA_VISIBLE_DEVICES": "void"}))
    assert seen(void["lines"]) == set()
