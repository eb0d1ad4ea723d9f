"""Under the toolkit's default settings, with the stack's plugin (DEVICE_LIST_STRATEGY=envvar) on a real kubelet:
the rendered DaemonSet's pod runs as rendered and the kubelet is offered exactly the exposed GPU; a tenant pod
gets the GPU the kubelet allocated; and without the guard, the routes the toolkit honours reach a hidden GPU
(the reason the guard exists: docs/security.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.controlplane import ControlPlane
from e2e.node import Node
from e2e.node_gpus import Toolkit
from tests.node.conftest import (
    GPU,
    NODE,
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
STRATEGY = "envvar"


@pytest.fixture(scope="module")
def deployed(node_plane: ControlPlane, node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    node.toolkit(Toolkit())
    apply_render(node_plane, rendered_objects(tmp_path_factory.mktemp("render"), STRATEGY, guard=False))
    pod = eventually(lambda: plugin_pod(node_plane, STRATEGY), "the plugin pod Running")
    yield pod
    delete_pods(node_plane)


def plugin_process_status() -> dict[str, str]:
    """/proc/<pid>/status of the stand-in plugin's process, as the host sees it."""
    for proc in Path("/proc").iterdir():
        try:
            if (proc / "cmdline").read_bytes().split(b"\0")[0] == b"/hidden-gpu-test-plugin":
                lines = (proc / "status").read_text().splitlines()
                return dict(line.split(":\t", 1) for line in lines if ":\t" in line)
        except OSError:
            continue
    return {}


def test_plugin_runs_as_rendered_and_offers_only_the_exposed_gpu(
    node_plane: ControlPlane, node: Node, deployed: Pod
) -> None:
    spec = deployed["spec"]
    assert spec["runtimeClassName"] == f"hidden-gpu-{NODE}"
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    # What runc applied, read from the host: a seccomp filter and no capability at all.
    status = eventually(plugin_process_status, "the plugin's process")
    assert status["Seccomp"].strip() == "2", status  # SECCOMP_MODE_FILTER
    assert int(status["CapEff"], 16) == 0, status
    assert status["NoNewPrivs"].strip() == "1", status
    # The kubelet's device manager: exactly the exposed UUID, and the node's allocatable says one GPU.
    eventually(
        lambda: node.checkpoint().get("RegisteredDevices", {}).get(GPU) == [EXPOSED],
        "the checkpoint's RegisteredDevices = the exposed UUID",
    )
    eventually(lambda: node.allocatable() == 1, "the node's allocatable nvidia.com/gpu = 1")
    assert node.node()["status"]["capacity"][GPU] == "1"


def test_a_tenant_pod_sees_exactly_the_gpu_the_kubelet_allocated(
    node_plane: ControlPlane, node: Node, deployed: Pod
) -> None:
    result = run_probe(node_plane, node, probe_pod("one-gpu", gpus=1))
    assert result["pod"]["status"]["phase"] in ("Running", "Succeeded"), result["pod"]["status"]
    given = allocated(node, result["pod"])
    assert given == [EXPOSED]
    assert seen(result["lines"]) == set(given)
    # The plugin answered as NVIDIA's does for envvar: the UUID in NVIDIA_VISIBLE_DEVICES.
    assert f"env NVIDIA_VISIBLE_DEVICES={EXPOSED}" in result["lines"]
    delete_pods(node_plane)


def test_routes_the_toolkit_honours_reach_hidden_gpus_without_the_guard(
    node_plane: ControlPlane, node: Node, deployed: Pod
) -> None:
    # nvidia.com/gpu: 0 and the image's ENV NVIDIA_VISIBLE_DEVICES=all: every GPU of the node, hidden ones too.
    zero = run_probe(node_plane, node, probe_pod("zero-gpus", gpus=0))
    assert seen(zero["lines"]) == {EXPOSED, *HIDDEN}
    assert allocated(node, zero["pod"]) == []
    # The variable naming a hidden GPU, no request: that GPU.
    env = run_probe(node_plane, node, probe_pod("env-hidden", env={"NVIDIA_VISIBLE_DEVICES": HIDDEN[0]}))
    assert seen(env["lines"]) == {HIDDEN[0]}
    # void: nothing.
    void = run_probe(node_plane, node, probe_pod("env-void", env={"NVIDIA_VISIBLE_DEVICES": "void"}))
    assert seen(void["lines"]) == set()
    assert "env NVIDIA_VISIBLE_DEVICES=void" in void["lines"]


def test_the_kubelet_refuses_a_gpu_beyond_what_the_plugin_offers(
    node_plane: ControlPlane, node: Node, deployed: Pod
) -> None:
    holder = run_probe(node_plane, node, probe_pod("holds-the-gpu", gpus=1, sleep=True))
    assert allocated(node, holder["pod"]) == [EXPOSED]
    # Bound straight to the node (the scheduler would keep it Pending): the kubelet's own admission refuses it.
    node_plane.create(probe_pod("one-too-many", gpus=1, node_name=NODE))
    refused = eventually(
        lambda: (
            (p := node_plane.request("GET", "/api/v1/namespaces/ml-team/pods/one-too-many"))["status"].get("phase")
            == "Failed"
            and p
        ),
        "the second 1-GPU pod refused",
    )
    assert refused["status"]["reason"] in ("UnexpectedAdmissionError", f"OutOf{GPU}"), refused["status"]
    delete_pods(node_plane)
