"""The Pulumi lifecycle for real: the pinned Pulumi CLI and Kubernetes provider (python -m e2e.build) run
this program (__main__.py, as an Automation API inline program) against the loopback control plane, with
a file backend and a passphrase. Every step is judged on the live objects through the API, never on
Pulumi's words: preview, up, an empty second preview, a changed UUID, a node leaving the stack, destroy,
cluster.release, and cluster.verify before and after tampering. The scheduler and the DaemonSet controller
are real; the kubelets are kwok's controller (conftest.py), which runs bound pods (Running, Ready) and removes
deleted ones. A node's nvidia.com/gpu is what the test registers it with: no device plugin runs here."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi import automation as auto
from pulumi.automation import OpType

from cluster import release, verify
from common.cli import EXIT_FINDING, EXIT_OK, EXIT_USAGE
from common.names import (
    DEVICE_PLUGIN_LABEL,
    FIELD_MANAGER,
    NODE_LABEL,
    NODE_SWITCHES_POLICY_NAME,
    OPERAND_LABELS,
    POLICY_NAME,
    STACK_LABEL,
    device_plugin_name,
    stack_record_name,
)
from e2e.controlplane import ApiError, ControlPlane
from offline import config_reference, render
from tests.real.conftest import add_gpu_node, eventually, set_node_status
from tests.real.harness import PLUGIN_NAMESPACE, Stopwatch, labels, pulumi_stack
from tests.support.stacks import EXPOSED, FULLY_HIDDEN, HIDDEN

STACK = "e2e"
# A GPU the stack hid, exposed in its place.
OTHER = HIDDEN[1]
TOOLKIT_LABEL = OPERAND_LABELS["container_toolkit"]


@dataclass
class Project:
    """A stack of this program in its own work directory and file backend."""

    work: Path
    stack: auto.Stack
    config: dict[str, Any]

    @property
    def stack_file(self) -> Path:
        return self.work / f"Pulumi.{STACK}.yaml"

    def write(self, change: Any = None) -> None:
        if change:
            change(self.config)
        self.stack_file.write_text(yaml.safe_dump({"config": self.config}, sort_keys=False))


def nodes(exposed: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "name": "gpu-node-01",
            "exposedGpus": exposed,
            "hiddenGpus": [u for u in (*HIDDEN, EXPOSED) if u not in exposed],
        },
        {"name": "gpu-node-02", "exposedGpus": [], "hiddenGpus": list(FULLY_HIDDEN)},
    ]


@pytest.fixture(scope="module")
def project(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Project:
    work = tmp_path_factory.mktemp("pulumi")
    config = {
        "pulumi:disable-default-providers": ["kubernetes"],
        "kubernetes:kubeconfig": str(plane.kubeconfig("admin")),
        "kubernetes:context": "admin@e2e",
        "hidden-gpu:nodes": nodes([EXPOSED]),
        "hidden-gpu:quotas": {"ml-training": 1},
    }
    # The GPU Operator labelled its nodes before hidden-gpu existed, as its own field manager.
    for name in ("gpu-node-01", "gpu-node-02", "cpu-node-by-hand"):
        plane.apply(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {DEVICE_PLUGIN_LABEL: "true"}}},
            manager="gpu-operator",
        )
    # Each node's nvidia.com/gpu as the stack's pinned plugin will have its kubelet advertise it (what verify
    # compares): kwok runs no plugin. That a kubelet advertises exactly the plugin's UUIDs is the node tier's to
    # show (tests/node: a real kubelet and the stand-in plugin), not this one's.
    for entry in nodes([EXPOSED]):
        set_node_status(plane, entry["name"], len(entry["exposedGpus"]))
    result = Project(work, None, config)  # type: ignore[arg-type]
    result.write()
    # The project's own config declarations (generated into Pulumi.yaml): the real CLI type-checks the
    # stack's config against them before the program runs.
    project_file = {"name": "hidden-gpu", "runtime": "python", "config": config_reference.pulumi_config()}
    (work / "Pulumi.yaml").write_text(yaml.safe_dump(project_file, sort_keys=False))
    result.stack = pulumi_stack(work, STACK, own_project_file=True)
    return result


def plugin(plane: ControlPlane, node: str) -> dict[str, Any] | None:
    return plane.get_or_none(f"/apis/apps/v1/namespaces/{PLUGIN_NAMESPACE}/daemonsets/{device_plugin_name(node)}")


def plugin_pods(plane: ControlPlane, name: str = "nvidia-device-plugin") -> list[dict[str, Any]]:
    """The pods of the plugin (or of a pinned operand, by its name) in the plugin's namespace."""
    path = f"/api/v1/namespaces/{PLUGIN_NAMESPACE}/pods?labelSelector=app.kubernetes.io/name%3D{name}"
    return list(plane.request("GET", path)["items"])


def run_verify(project: Project, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = verify.main(["--stack-file", str(project.stack_file), "--deadline", "30"])
    return status, capsys.readouterr().out


TIMES = Stopwatch("lifecycle")


def test_lifecycle(plane: ControlPlane, project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    """One stack's life, in order: each step starts from what the one before left."""
    first_up(plane, project, capsys)
    change_a_uuid(plane, project)
    tamper_and_repair(plane, project, capsys)
    node_reregisters(plane, project, capsys)
    leave_destroy_release(plane, project, capsys)
    TIMES.record()


def first_up(plane: ControlPlane, project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    stack = project.stack
    preview = TIMES.timed("preview", lambda: stack.preview(diff=True))
    assert preview.change_summary.get(OpType.CREATE, 0) >= 15, preview.change_summary
    assert labels(plane, "gpu-node-01")[DEVICE_PLUGIN_LABEL] == "true"  # a preview changes nothing

    TIMES.timed("up", lambda: stack.up(on_output=None))
    for node in ("gpu-node-01", "gpu-node-02"):
        assert labels(plane, node)[DEVICE_PLUGIN_LABEL] == "false", node
        assert labels(plane, node)[NODE_LABEL] == node
    assert labels(plane, "gpu-node-02")[TOOLKIT_LABEL] == "false"
    assert TOOLKIT_LABEL not in labels(plane, "gpu-node-01")
    # The render's resource graph (what the review's identity lines come from) names exactly what the real
    # engine registered: the URNs offline.diff and the golden-URN test judge are the engine's.
    deployment = stack.export_stack().deployment or {}
    state = {r["urn"] for r in deployment["resources"] if r["type"] != "pulumi:pulumi:Stack"}
    rendered = {r["urn"] for r in render.graph(render.render(project.stack_file))["resources"]}
    assert state == rendered, sorted(state ^ rendered)
    # The switch is ours now, under the well-known manager; the operator's manager no longer owns it.
    managers = {
        f["manager"]
        for f in plane.request("GET", "/api/v1/nodes/gpu-node-01")["metadata"]["managedFields"]
        if f"f:{DEVICE_PLUGIN_LABEL}" in json.dumps(f.get("fieldsV1", {}))
    }
    assert managers == {FIELD_MANAGER}, managers
    # The real DaemonSet controller made one pod, and the real scheduler bound it to exactly its node.
    pods = eventually(lambda: plugin_pods(plane), what="the plugin pod")
    assert [p["spec"]["nodeName"] for p in pods] == ["gpu-node-01"]
    # And the pinned dcgm-exporter beside it (the default where a GPU is exposed), on that node alone.
    exporters = eventually(lambda: plugin_pods(plane, "dcgm-exporter"), what="the pinned exporter's pod")
    assert [p["spec"]["nodeName"] for p in exporters] == ["gpu-node-01"]
    assert plane.request("GET", f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{POLICY_NAME}")

    status, out = run_verify(project, capsys)
    assert status == EXIT_OK, out

    TIMES.timed("preview again", lambda: stack.preview(expect_no_changes=True))


def change_a_uuid(plane: ControlPlane, project: Project) -> None:
    stack = project.stack
    project.write(lambda c: c.__setitem__("hidden-gpu:nodes", nodes([OTHER])))
    changed = TIMES.timed("preview a changed UUID", lambda: stack.preview(diff=True))
    # The plugin's and the pinned exporter's DaemonSets and the stack's record, in place: nothing replaced.
    assert changed.change_summary.get(OpType.UPDATE) == 3, changed.change_summary
    assert OpType.REPLACE not in changed.change_summary, changed.change_summary
    # Exactly that field, on each DaemonSet. The engine's diff names the list index (`env[0]`), not the
    # variable: the review has to know env[0] is NVIDIA_VISIBLE_DEVICES (offline.diff names it).
    assert f'value: "{EXPOSED}" => "{OTHER}"' in changed.stdout, changed.stdout
    assert "kubernetes:apps/v1:DaemonSet: (update)" in changed.stdout
    TIMES.timed("up a changed UUID", stack.up)
    daemonset = plugin(plane, "gpu-node-01")
    assert daemonset is not None
    env = {e["name"]: e.get("value") for e in daemonset["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == OTHER


def tamper_and_repair(plane: ControlPlane, project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    """Tampering, seen by verify: the switch removed, the guard only warning, the guard failing open."""
    stack = project.stack
    policy = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{POLICY_NAME}"
    plane.request("PATCH", policy, {"spec": {"failurePolicy": "Ignore"}}, content_type="application/merge-patch+json")
    saved = labels(plane, "gpu-node-02")[DEVICE_PLUGIN_LABEL]

    def remove_switch() -> bool:
        plane.request("PATCH", "/api/v1/nodes/gpu-node-02", {"metadata": {"labels": {DEVICE_PLUGIN_LABEL: None}}},
                      content_type="application/merge-patch+json")  # fmt: skip
        return True

    # The node-switches policy refuses it while it denies (tests/real/test_gpu_operator.py has why); its binding is
    # tampered with too, to warn only.
    with pytest.raises(ApiError, match="rule node-switches"):
        remove_switch()
    switches = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{NODE_SWITCHES_POLICY_NAME}"
    binding = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{POLICY_NAME}"
    for tampered in (switches, binding):
        plane.request(
            "PATCH", tampered, {"spec": {"validationActions": ["Warn"]}}, content_type="application/merge-patch+json"
        )
    # The API server takes a binding's change from its informer, a moment later.
    eventually(remove_switch, what="the switch removed once the binding only warns")
    status, out = run_verify(project, capsys)
    assert status == EXIT_FINDING, out
    wrong = [line.split()[:4] for line in out.splitlines() if line.endswith("MISMATCH")]
    assert sorted(wrong) == sorted(
        [
            ["gpu-node-02", "label", DEVICE_PLUGIN_LABEL, "false"],
            ["cluster", "binding", POLICY_NAME, "actions"],
            ["cluster", "binding", NODE_SWITCHES_POLICY_NAME, "actions"],
            ["cluster", "ValidatingAdmissionPolicy", POLICY_NAME, "failurePolicy"],
        ]
    ), out
    TIMES.timed("up without refresh", stack.up)
    # Pulumi compares with its state, not the cluster: without a refresh the removed label stays removed.
    assert DEVICE_PLUGIN_LABEL not in labels(plane, "gpu-node-02")
    # validationActions is a set list: server-side apply keeps the Warn another manager set and adds Deny,
    # which the API server refuses ("must not contain both Deny and Warn"). So `up` cannot repair this
    # binding; the runbook's repair is an update that replaces the list (docs/operations.md).
    for tampered in (switches, binding):
        plane.request(
            "PATCH", tampered, {"spec": {"validationActions": ["Deny"]}}, content_type="application/merge-patch+json"
        )
    TIMES.timed("refresh", stack.refresh)
    TIMES.timed("up after refresh", stack.up)
    assert labels(plane, "gpu-node-02")[DEVICE_PLUGIN_LABEL] == saved == "false"
    assert plane.request("GET", binding)["spec"]["validationActions"] == ["Deny"]
    assert plane.request("GET", policy)["spec"]["failurePolicy"] == "Fail"  # a scalar: the forced apply wins
    TIMES.timed("preview after repair", lambda: stack.preview(expect_no_changes=True))


def node_reregisters(plane: ControlPlane, project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    """The Node object is deleted and its kubelet registers it again, without hidden-gpu's labels: the
    GPU Operator would deploy its all-GPU plugin there within seconds. `up` alone does not see it (the
    patch is in its state); the drift job's preview with refresh and verify do; refresh + up repairs it."""
    stack = project.stack
    plane.request("DELETE", "/api/v1/nodes/gpu-node-02")
    eventually(lambda: plane.get_or_none("/api/v1/nodes/gpu-node-02") is None, what="the node gone")
    add_gpu_node(plane, "gpu-node-02", 8)  # as its kubelet registers it: the operator's plugin saw 8 GPUs
    TIMES.timed("up after re-registration", stack.up)
    assert DEVICE_PLUGIN_LABEL not in labels(plane, "gpu-node-02")  # the window: no diff, no label
    with pytest.raises(auto.CommandError):  # drift.yml's check
        stack.preview(refresh=True, expect_no_changes=True)
    status, out = run_verify(project, capsys)
    wrong = [line.split()[:3] for line in out.splitlines() if line.endswith("MISMATCH")]
    assert status == EXIT_FINDING and ["gpu-node-02", "label", DEVICE_PLUGIN_LABEL] in wrong, out
    # And the operator's plugin's 8 GPUs the kubelet registered the node with, where the stack advertises none.
    assert ["gpu-node-02", "capacity", "nvidia.com/gpu"] in wrong, out
    TIMES.timed("refresh", stack.refresh)
    TIMES.timed("up after refresh", stack.up)
    assert labels(plane, "gpu-node-02")[DEVICE_PLUGIN_LABEL] == "false"


def leave_destroy_release(plane: ControlPlane, project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    """A node leaves the stack: its plugin goes, its labels stay (the patch is retained). Release then gives
    back only what hidden-gpu hid and what no stack in this cluster still lists."""
    stack = project.stack
    project.write(lambda c: c.__setitem__("hidden-gpu:nodes", copy.deepcopy(nodes([OTHER])[1:])))
    TIMES.timed("up without gpu-node-01", stack.up)
    assert plugin(plane, "gpu-node-01") is None
    assert labels(plane, "gpu-node-01")[DEVICE_PLUGIN_LABEL] == "false"
    record = plane.request("GET", f"/api/v1/namespaces/{PLUGIN_NAMESPACE}/configmaps/{stack_record_name(STACK)}")
    assert record["data"] == {"stack": STACK, "node.gpu-node-02": ""}

    # A file that does not list gpu-node-02 is not enough: the stack's record in this cluster still does.
    elsewhere = project.work / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    other_file = elsewhere / "Pulumi.other.yaml"
    other_file.write_text(yaml.safe_dump({"config": {**project.config, "hidden-gpu:nodes": nodes([EXPOSED])[:1]}}))
    assert release.main(["--stack-file", str(other_file), "--node", "gpu-node-02", "--yes"]) == EXIT_USAGE
    assert f"stack {STACK} still hides it in this cluster" in capsys.readouterr().err
    # A node hidden by hand (the recipe's `kubectl label`), in no stack: not hidden-gpu's to give back.
    plane.request(
        "PATCH",
        "/api/v1/nodes/cpu-node-by-hand?fieldManager=kubectl-label",
        {"metadata": {"labels": {DEVICE_PLUGIN_LABEL: "false"}}},
        content_type="application/merge-patch+json",
    )
    assert release.main(["--stack-file", str(other_file), "--node", "cpu-node-by-hand", "--yes"]) == EXIT_USAGE
    assert "not hidden by hidden-gpu (nvidia.com/gpu.deploy.device-plugin set by kubectl-label" in (
        capsys.readouterr().err
    )
    assert labels(plane, "cpu-node-by-hand")[DEVICE_PLUGIN_LABEL] == "false"

    TIMES.timed("destroy", stack.destroy)
    # The guard outlives destroy, like the label patches: the retained hidden nodes stay guarded.
    guard = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{POLICY_NAME}"
    assert plane.request("GET", guard)["spec"]["validationActions"] == ["Deny"]
    # Retained on delete, like the label patches (components/plugin_namespace.py): still there, empty.
    assert plane.request("GET", f"/api/v1/namespaces/{PLUGIN_NAMESPACE}")["status"]["phase"] == "Active"
    assert plugin_pods(plane) == [] or all(p["metadata"].get("deletionTimestamp") for p in plugin_pods(plane))
    for node in ("gpu-node-01", "gpu-node-02"):
        assert labels(plane, node)[DEVICE_PLUGIN_LABEL] == "false", node
    # The record goes with the stack: a destroyed stack claims no node.
    records = plane.request("GET", f"/api/v1/configmaps?labelSelector={STACK_LABEL}")["items"]
    assert records == []

    # The deliberate way back, by the real API server's server-side apply: hidden-gpu gives up its fields.
    assert release.main(["--stack-file", str(project.stack_file), "--node", "gpu-node-01", "--yes"]) == EXIT_OK
    assert DEVICE_PLUGIN_LABEL not in labels(plane, "gpu-node-01") and NODE_LABEL not in labels(plane, "gpu-node-01")
    assert release.main(["--stack-file", str(project.stack_file), "--node", "gpu-node-02", "--yes"]) == EXIT_USAGE
    assert labels(plane, "gpu-node-02")[TOOLKIT_LABEL] == "false"
    capsys.readouterr()
