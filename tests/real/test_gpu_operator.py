"""The recipe against NVIDIA's GPU Operator itself: its controller (e2e/gpu_operator.py: the one version the module
proxy serves, under its chart's service account and RBAC) beside the real control plane, kwok as the kubelets.

Each step is judged on the live objects after the operator's own reconciles, forced where the operator would not
run by itself (a ClusterPolicy spec change, a restart): the operator's plugin on every GPU node before hidden-gpu,
none on a hidden node after `pulumi up`, the operands each node's `operands` say, cluster.verify passing and then
naming the operator's DaemonSet on a hidden node; the operands toggle that un-hid a node; a release that brought
nothing back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi import automation as auto

from cluster import release, verify
from common.cli import EXIT_FINDING, EXIT_OK
from common.names import (
    DEPLOY_LABEL_PREFIX,
    DEVICE_PLUGIN_LABEL,
    GPU_PRESENT_LABEL,
    NODE_LABEL,
    NODE_SWITCHES_POLICY_NAME,
    OPERANDS_LABEL,
    OPERANDS_OFF_ANNOTATION,
)
from e2e import gpu_operator
from e2e.controlplane import ApiError, ControlPlane
from tests.real.conftest import add_gpu_node, eventually, seeded_plane, set_node_status
from tests.real.harness import Stopwatch, labels, pulumi_stack
from tests.support.stacks import EXPOSED, FULLY_HIDDEN, HIDDEN

pytestmark = pytest.mark.real

STACK = "operator"
PARTLY, FULLY, THEIRS = "gpu-node-01", "gpu-node-02", "gpu-node-03"
# A line the operator logs in every reconcile once it has labelled the GPU nodes (state_manager.go:577).
LABELLED = "Number of nodes with GPU label"
TIMES = Stopwatch("gpu-operator")


@dataclass
class Cluster:
    plane: ControlPlane
    module: Path
    work: Path
    stack: auto.Stack
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def stack_file(self) -> Path:
        return self.work / f"Pulumi.{STACK}.yaml"

    def write(self, nodes: list[dict[str, Any]]) -> None:
        self.config["hidden-gpu:nodes"] = nodes
        self.stack_file.write_text(yaml.safe_dump({"config": self.config}, sort_keys=False))


def stack_nodes() -> list[dict[str, Any]]:
    return [
        {"name": PARTLY, "exposedGpus": [EXPOSED], "hiddenGpus": list(HIDDEN)},
        {"name": FULLY, "exposedGpus": [], "hiddenGpus": list(FULLY_HIDDEN)},
    ]


@pytest.fixture(scope="module")
def cluster(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Its own plane (the operator deploys to every GPU node it sees), the operator installed as its chart installs
    it, and a stack hiding one node partly and one fully; a third GPU node stays the operator's."""
    with seeded_plane(bin_dir) as plane:
        add_gpu_node(plane, THEIRS, 8)
        module = gpu_operator.module_dir()
        gpu_operator.install(plane, module)
        TIMES.timed("operator ready", lambda: gpu_operator.start(plane, module))
        work = tmp_path_factory.mktemp("operator")
        config = {
            "pulumi:disable-default-providers": ["kubernetes"],
            "kubernetes:kubeconfig": str(plane.kubeconfig("admin")),
            "kubernetes:context": "admin@e2e",
        }
        result = Cluster(plane, module, work, pulumi_stack(work, STACK), config)
        result.write(stack_nodes())
        try:
            yield result
        finally:
            TIMES.record()


def operands_on(plane: ControlPlane, node: str) -> set[str]:
    """The operands (gpu.deploy.<operand>) whose operator DaemonSets have a live pod on the node."""
    by_daemonset = {
        ds["metadata"]["name"]: key.removeprefix(DEPLOY_LABEL_PREFIX)
        for ds in gpu_operator.daemonsets(plane)
        for key in (ds["spec"]["template"]["spec"].get("nodeSelector") or {})
        if key.startswith(DEPLOY_LABEL_PREFIX)
    }
    pods = plane.request("GET", f"/api/v1/namespaces/{gpu_operator.NAMESPACE}/pods")["items"]
    return {
        by_daemonset[ref["name"]]
        for pod in pods
        if pod["spec"].get("nodeName") == node and not pod["metadata"].get("deletionTimestamp")
        for ref in pod["metadata"].get("ownerReferences") or []
        if ref.get("kind") == "DaemonSet" and ref["name"] in by_daemonset
    }


def held(plane: ControlPlane, node: str) -> set[str]:
    """What hidden-gpu holds off there, by its record on the node."""
    annotations = plane.request("GET", f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {}
    return set(annotations[OPERANDS_OFF_ANNOTATION].split(","))


def reconciled(plane: ControlPlane, cause: Callable[[], Any], what: str) -> None:
    """`cause`, then wait until the operator has labelled the GPU nodes again in a reconcile that followed it."""
    before = gpu_operator.log_tail(plane, 10**9).count(LABELLED)
    cause()
    eventually(lambda: gpu_operator.log_tail(plane, 10**9).count(LABELLED) > before, 60, f"a reconcile after {what}")


def patch_labels(plane: ControlPlane, node: str, changes: dict[str, str | None]) -> None:
    plane.request(
        "PATCH",
        f"/api/v1/nodes/{node}?fieldManager=kubectl-label",
        {"metadata": {"labels": changes}},
        content_type="application/merge-patch+json",
    )


class Watch:
    """Samples a node every 50 ms while the test acts: the operator's device-plugin switch and plugin pod there."""

    def __init__(self, plane: ControlPlane, node: str) -> None:
        self.plane, self.node, self.seen = plane, node, set[str]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.seen.add(f"switch {labels(self.plane, self.node).get(DEVICE_PLUGIN_LABEL, '<absent>')}")
                if self.node in gpu_operator.plugin_pods(self.plane):
                    self.seen.add("operator plugin pod")
            except (ApiError, OSError):
                continue

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def test_before_hidden_gpu_the_operators_plugin_runs_on_every_gpu_node(cluster: Cluster) -> None:
    """The tier's nodes are what the operator calls GPU nodes (NFD's labels): it labels each and deploys there."""
    plane = cluster.plane
    nodes = {PARTLY, FULLY, THEIRS}
    eventually(lambda: nodes <= set(gpu_operator.plugin_pods(plane)), 120, "the operator's plugin on every GPU node")
    for node in nodes:
        assert labels(plane, node)[GPU_PRESENT_LABEL] == "true", node
        assert labels(plane, node)[DEVICE_PLUGIN_LABEL] == "true", node


def test_up_takes_the_operators_plugin_off_hidden_nodes_through_its_own_reconciles(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    plane = cluster.plane
    for entry in stack_nodes():  # what the pinned plugin has the kubelet advertise: kwok runs no plugin
        set_node_status(plane, entry["name"], len(entry["exposedGpus"]))
    TIMES.timed("up", cluster.stack.up)
    # The device plugin, GFD, mig-manager, DCGM and dcgm-exporter (hidden-gpu's own runs there, pinned); all seven
    # where nothing is exposed.
    expected_held = {PARTLY: 5, FULLY: 7}
    for node, count in expected_held.items():
        assert len(held(plane, node)) == count, held(plane, node)

    def as_stacked() -> bool:
        for node in (PARTLY, FULLY):
            assert not operands_on(plane, node) & held(plane, node), (node, operands_on(plane, node))
            assert all(labels(plane, node)[DEPLOY_LABEL_PREFIX + op] == "false" for op in held(plane, node))
        # The partly hidden node keeps the operands that read no hidden GPU's identity: the toolkit, the validator.
        assert {"container-toolkit", "operator-validator"} <= operands_on(plane, PARTLY), operands_on(plane, PARTLY)
        assert "device-plugin" in operands_on(plane, THEIRS)
        return True

    eventually(as_stacked, 60, "each node's operands as the stack says")
    # After each forced reconcile, as the stack says again (a ClusterPolicy change rolls the operator's own plugin
    # pods on its other node, and the marker line comes before its DaemonSets are written: wait, do not sample).
    reconciled(plane, lambda: gpu_operator.touch(plane), "a ClusterPolicy change")
    eventually(as_stacked, 60, "each node's operands as the stack says, after a ClusterPolicy change")
    reconciled(plane, lambda: TIMES.timed("operator restart", lambda: gpu_operator.restart(plane)), "a restart")
    eventually(as_stacked, 60, "each node's operands as the stack says, after a restart")
    status = verify.main(["--stack-file", str(cluster.stack_file), "--deadline", "30"])
    assert status == EXIT_OK, capsys.readouterr().out


def test_an_operands_toggle_never_unhides_a_node_and_the_operator_keeps_working(cluster: Cluster) -> None:
    """`gpu.deploy.operands=false` makes the operator delete every switch of the node (let through: no operand runs
    without its switch); removing it would make the operator add them as `true`: refused until they are `false`
    again. The operator's own write is never refused, and it goes on deploying elsewhere."""
    plane = cluster.plane
    with Watch(plane, FULLY) as watch:
        reconciled(plane, lambda: patch_labels(plane, FULLY, {OPERANDS_LABEL: "false"}), "operands=false")
        eventually(
            lambda: not [k for k in labels(plane, FULLY) if k.startswith(DEPLOY_LABEL_PREFIX) and k != OPERANDS_LABEL],
            30,
            "the operator deleting the node's switches",
        )
        with pytest.raises(ApiError) as refused:
            patch_labels(plane, FULLY, {OPERANDS_LABEL: None})
        assert refused.value.code in (403, 422), refused.value
        assert f"rule {NODE_SWITCHES_POLICY_NAME.removeprefix('hidden-gpu-')}" in refused.value.message
        assert f"{DEVICE_PLUGIN_LABEL} must stay false" in refused.value.message
        # What the refusal says to do, in one write (a reconcile between two would delete the switches again):
        # the switches back at false and the toggle off.
        back = {DEPLOY_LABEL_PREFIX + op: "false" for op in held(plane, FULLY)}
        reconciled(plane, lambda: patch_labels(plane, FULLY, {**back, OPERANDS_LABEL: None}), "operands removed")
        reconciled(plane, lambda: gpu_operator.touch(plane), "a ClusterPolicy change")
        # What hidden-gpu does not hold comes back, and the operator goes on deploying elsewhere.
        eventually(lambda: labels(plane, FULLY).get("nvidia.com/gpu.deploy.driver") == "true", 30, "the driver switch")
        eventually(lambda: "device-plugin" in operands_on(plane, THEIRS), 60, "the operator's plugin on its own node")
    assert "switch true" not in watch.seen and "operator plugin pod" not in watch.seen, watch.seen
    assert labels(plane, FULLY)[DEVICE_PLUGIN_LABEL] == "false"


def test_verify_names_the_operators_daemonset_on_a_hidden_node(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the node-switches binding (deleted by hand), the toggle un-hides the node: verify names it."""
    plane = cluster.plane
    binding = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{NODE_SWITCHES_POLICY_NAME}"
    plane.request("DELETE", binding)
    # The policy plugin learns of the deletion from its informer: wait until a write the binding denied passes.
    eventually(
        lambda: plane.request(
            "PATCH",
            f"/api/v1/nodes/{FULLY}?dryRun=All",
            {"metadata": {"labels": {DEVICE_PLUGIN_LABEL: "true"}}},
            content_type="application/merge-patch+json",
        ),
        30,
        "the binding's deletion in force",
    )
    reconciled(plane, lambda: patch_labels(plane, FULLY, {OPERANDS_LABEL: "false"}), "operands=false")
    eventually(lambda: DEVICE_PLUGIN_LABEL not in labels(plane, FULLY), 30, "the switches deleted")
    reconciled(plane, lambda: patch_labels(plane, FULLY, {OPERANDS_LABEL: None}), "operands removed")
    eventually(lambda: FULLY in gpu_operator.plugin_pods(plane), 60, "the operator's plugin on the hidden node")
    status = verify.main(["--stack-file", str(cluster.stack_file), "--deadline", "30"])
    out = capsys.readouterr().out
    assert status == EXIT_FINDING, out
    wrong = [line for line in out.splitlines() if line.endswith("MISMATCH")]
    assert any(line.startswith(FULLY) and f"DaemonSet {gpu_operator.PLUGIN_DAEMONSET}" in line for line in wrong), out
    assert any(f"binding {NODE_SWITCHES_POLICY_NAME} actions" in line and "<missing>" in line for line in wrong), out
    # The repair: refresh (Pulumi sees the binding and the switches gone), then up puts both back.
    TIMES.timed("refresh", cluster.stack.refresh)
    TIMES.timed("up after refresh", cluster.stack.up)
    eventually(lambda: FULLY not in gpu_operator.plugin_pods(plane), 60, "the operator's plugin gone again")
    assert verify.main(["--stack-file", str(cluster.stack_file), "--deadline", "30"]) == EXIT_OK, (
        capsys.readouterr().out
    )


def test_release_hands_the_node_back_and_the_operator_deploys_there(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """The node leaves the stack, then `cluster.release`: the operator labels it as a GPU node it just found and its
    plugin runs there again, within the bound the command waits (measured: docs/performance.md)."""
    plane = cluster.plane
    cluster.write(stack_nodes()[1:])
    TIMES.timed("up without the node", cluster.stack.up)
    assert labels(plane, PARTLY)[DEVICE_PLUGIN_LABEL] == "false"  # retained: still hidden
    started = time.monotonic()
    status = release.main(["--stack-file", str(cluster.stack_file), "--node", PARTLY, "--yes"])
    out = capsys.readouterr().out
    eventually(lambda: PARTLY in gpu_operator.plugin_pods(plane), 30, "the operator's plugin back on the node")
    TIMES["release to the operator's plugin pod"] = round(time.monotonic() - started, 1)
    assert status == EXIT_OK, out
    assert "the GPU Operator labelled it again in" in out, out
    after = labels(plane, PARTLY)
    assert NODE_LABEL not in after and after[GPU_PRESENT_LABEL] == "true" and after[DEVICE_PLUGIN_LABEL] == "true"
