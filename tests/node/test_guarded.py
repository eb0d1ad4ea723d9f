"""The other half of each route on the real node (issue 30): with the rendered guard applied, the API server denies
the routes tests/node/test_defaults.py shows reaching hidden GPUs under the toolkit's defaults, each by its rule,
while the allocated pod still runs and sees exactly its GPU; and host.audit reading this kubelet's PodResources
socket and the pods' real cgroups. NVML is the one stand-in here (a host record naming the node's GPUs and which
process runs where): no GPU in CI."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster import verify
from common.names import DEFAULT_PLUGIN_NAMESPACE, PINNED_OPERANDS, device_plugin_name, pinned_operand_name
from e2e.controlplane import ControlPlane
from e2e.node import Node
from e2e.node_gpus import Toolkit
from tests.node.conftest import (
    NODE,
    TENANT,
    allocated,
    apply_render,
    delete_pods,
    eventually,
    plugin_pod,
    probe_pid,
    probe_pod,
    remove_guard,
    rendered_objects,
    run_audit,
    run_probe,
    seen,
    stack,
)
from tests.real.harness import denial, rule_in
from tests.support.stacks import EXPOSED, HIDDEN, write_stack

Pod = dict[str, Any]
STRATEGY = "envvar"


@pytest.fixture(scope="module")
def guarded(node_plane: ControlPlane, node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """The whole render, guard included, under the toolkit's defaults; the guard removed again afterwards (the
    modules after this one run routes without it)."""
    node.toolkit(Toolkit())
    objects = rendered_objects(tmp_path_factory.mktemp("render"), STRATEGY, guard=True)
    apply_render(node_plane, objects)
    pod = eventually(lambda: plugin_pod(node_plane, STRATEGY), "the plugin pod Running")
    probe = probe_pod("zero-gpus", gpus=0)
    eventually(lambda: "hidden-gpu guard" in (denial(node_plane, probe, namespace=TENANT, identity="admin") or ""),
               "the guard in force")  # fmt: skip
    yield pod
    delete_pods(node_plane)
    remove_guard(node_plane, objects)


@pytest.mark.parametrize(
    ("pod", "rule"),
    [
        (probe_pod("zero-gpus", gpus=0), "gpu-runtime-needs-a-request"),
        (probe_pod("env-hidden", env={"NVIDIA_VISIBLE_DEVICES": HIDDEN[0]}), "gpu-runtime-needs-a-request"),
        (probe_pod("env-hidden-with-gpu", gpus=1, env={"NVIDIA_VISIBLE_DEVICES": HIDDEN[0]}), "visible-devices-env"),
        (probe_pod("unserved-by-name", gpus=1, node_name=NODE), "node-name"),
    ],
    ids=["zero-quantity", "variable-without-request", "variable-beside-a-request", "bound-by-name"],
)
def test_the_guard_denies_what_reached_hidden_gpus(
    node_plane: ControlPlane, guarded: Pod, pod: dict[str, Any], rule: str
) -> None:
    assert rule_in(denial(node_plane, pod, namespace=TENANT, identity="admin")) == rule


def test_the_allocated_pod_still_runs_under_the_guard(node_plane: ControlPlane, node: Node, guarded: Pod) -> None:
    result = run_probe(node_plane, node, probe_pod("one-gpu", gpus=1))
    assert allocated(node, result["pod"]) == [EXPOSED]
    assert seen(result["lines"]) == {EXPOSED}
    delete_pods(node_plane)


def test_audit_reads_this_kubelet_and_the_pods_cgroups(
    node_plane: ControlPlane, node: Node, guarded: Pod, tmp_path: Path
) -> None:
    """The real kubelet's PodResources answer (allocatable = the exposed UUID, allocated to the holder), the real
    cgroup path containerd and runc gave the holder's process, the kubelet's own log directory for its name. The
    process on its allocated GPU is clean; the same process shown on a hidden GPU is a violation naming the pod."""
    holder = run_probe(node_plane, node, probe_pod("holder", gpus=1, sleep=True))["pod"]
    pid = probe_pid(holder["metadata"]["uid"])
    stack_file = write_stack(tmp_path, stack(STRATEGY), name="node")

    def scan(on: str) -> tuple[int, str]:
        return run_audit(node, tmp_path, stack_file, [EXPOSED, *HIDDEN], {on: pid})

    status, out = scan(EXPOSED)
    assert status == 0, out
    assert "kubelet PodResources: read" in out and f"pid {pid}: pod {TENANT}/holder container probe" in out
    status, out = scan(HIDDEN[0])
    assert status == 1, out
    assert f"pid {pid}: a pod uses a hidden GPU" in out and f"{TENANT}/holder" in out
    delete_pods(node_plane)


def test_verify_against_this_node_finds_only_the_stand_in_images(
    node_plane: ControlPlane, guarded: Pod, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """cluster.verify with the whole render applied: the node's capacity and allocatable as the real kubelet reports
    them after the plugin registered, the plugin pod Ready with the exposed UUID, labels, guard, record, and every
    object around the plugins as declared but for the images this tier swaps in."""
    stack_file = write_stack(tmp_path, stack(STRATEGY), name="node")
    kubeconfig = str(node_plane.kubeconfig("admin"))
    status = verify.main(["--stack-file", str(stack_file), "--kubeconfig", kubeconfig, "--json", "--deadline", "30"])
    report = json.loads(capsys.readouterr().out)
    failed = {c["what"]: c["actual"].split("; ") for c in report["checks"] if not c["ok"]}
    # The one thing that differs from the stack: the node tier runs stand-ins for NVIDIA's images (e2e.images), and
    # verify, reading the DaemonSets whole, says so field by field, and nothing else.
    substituted = re.compile(
        r"spec\.template\.spec\.(init)?[cC]ontainers\[[\w-]+\]\.(image hidden-gpu\.test/\S+|imagePullPolicy Never)"
    )
    stand_ins = [pinned_operand_name(PINNED_OPERANDS["dcgm_exporter"], NODE), device_plugin_name(NODE)]
    assert status == 1 and sorted(failed) == [f"DaemonSet {DEFAULT_PLUGIN_NAMESPACE}/{d}" for d in stand_ins], failed
    assert all(substituted.fullmatch(said) for found in failed.values() for said in found), failed
    rows = {f"{c['scope']} {c['what']}": c["actual"] for c in report["checks"]}
    assert rows[f"{NODE} allocatable nvidia.com/gpu"] == "1"
    assert rows[f"{NODE} plugin NVIDIA_VISIBLE_DEVICES"] == EXPOSED
