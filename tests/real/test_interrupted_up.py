"""A first `pulumi up` interrupted by the API server's death (issue 29, 4): no node may be switched to hidden
(the GPU Operator's plugin gone, the tenant routes open) before every object of the guard exists, at any
moment, and the next `up` converges. Its own control plane: the session's keeps the guard other modules
retain, and a first `up` needs a cluster without one.

Two witnesses: a sampler that reads the nodes and the guard every 50 ms throughout, and the API server's own
audit log, which orders every write to the microsecond: each guard object's first successful write must
complete before the first node patch is received. The nodes' kubelets are kwok (conftest.py), which runs the plugin
pods `up` waits for and, like a kubelet, outlives the API server's death."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi import automation as auto

from common.names import (
    CLAIMS_POLICY_NAME,
    DEVICE_PLUGIN_LABEL,
    ENV_KEYS_POLICY_NAME,
    NODE_LABEL,
    NODE_SWITCHES_POLICY_NAME,
    POLICY_NAME,
)
from e2e.controlplane import USER_AGENT, ApiError, ControlPlane
from tests.real.conftest import GPU_NODES, eventually, seeded_plane
from tests.real.harness import pulumi_stack
from tests.support.stacks import EXPOSED, FULLY_HIDDEN, HIDDEN

STACK = "interrupted"
REPO = Path(__file__).resolve().parents[2]
# How long the API server stays dead, and how long `up` may take to end once it is back.
DOWN_SECONDS = 5
UP_AFTER_RESTART_SECONDS = 300
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
# The guard's objects as the API server lists them: (collection, name).
GUARD = [
    (f"{ADMISSION}/{kind}", name)
    for kind in ("validatingadmissionpolicies", "validatingadmissionpolicybindings")
    for name in (POLICY_NAME, ENV_KEYS_POLICY_NAME, CLAIMS_POLICY_NAME, NODE_SWITCHES_POLICY_NAME)
]


def hidden_nodes(plane: ControlPlane) -> set[str]:
    items = plane.request("GET", "/api/v1/nodes")["items"]
    return {n["metadata"]["name"] for n in items if n["metadata"].get("labels", {}).get(DEVICE_PLUGIN_LABEL) == "false"}


def guard_present(plane: ControlPlane) -> set[tuple[str, str]]:
    present = set()
    for collection, name in GUARD:
        listed = plane.request("GET", collection)["items"]
        if any(item["metadata"]["name"] == name for item in listed):
            present.add((collection, name))
    return present


class Sampler(threading.Thread):
    """Every 50 ms: which nodes are hidden and which guard objects exist; a sample with a hidden node and a
    missing guard object is a violation. A sample the dead API server cannot answer is skipped."""

    def __init__(self, plane: ControlPlane) -> None:
        super().__init__(daemon=True)
        self.plane = plane
        self.stopping = threading.Event()
        self.samples = 0
        self.violations: list[str] = []
        self.hidden_seen = False

    def run(self) -> None:
        while not self.stopping.wait(0.05):
            try:
                hidden = hidden_nodes(self.plane)
                present = guard_present(self.plane) if hidden else set()
            except (ApiError, OSError, http.client.HTTPException):  # a response cut off by the kill: IncompleteRead
                continue
            self.samples += 1
            if hidden:
                self.hidden_seen = True
                if present != set(GUARD):
                    self.violations.append(f"{sorted(hidden)} hidden; guard has only {sorted(present)}")


@pytest.fixture
def plane(bin_dir: Path) -> Iterator[ControlPlane]:
    with seeded_plane(bin_dir) as started:
        operator_switch(started)
        yield started


def operator_switch(plane: ControlPlane) -> None:
    """The GPU Operator's switch on every node, as its own field manager: the cluster before hidden-gpu."""
    for name in GPU_NODES:
        plane.apply(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {DEVICE_PLUGIN_LABEL: "true"}}},
            manager="gpu-operator",
        )


def start_over(plane: ControlPlane, stack: auto.Stack) -> None:
    """Back to a cluster that never had hidden-gpu: the stack's state emptied (the node switch and the guard are
    retained on delete, by design), then the operator's switch put back and the guard removed by hand."""
    stack.destroy(on_output=None)
    # The switch back first: the sampler must not see a hidden node while the guard goes. In the same write as the
    # node label, as a release does: the node-switches policy (if the killed up got as far) refuses it alone.
    for name in GPU_NODES:
        plane.request(
            "PATCH",
            f"/api/v1/nodes/{name}?fieldManager=gpu-operator",
            {"metadata": {"labels": {DEVICE_PLUGIN_LABEL: "true", NODE_LABEL: None}}},
            content_type="application/merge-patch+json",
        )
    operator_switch(plane)
    for collection, name in guard_present(plane):
        plane.request("DELETE", f"{collection}/{name}")
    assert not hidden_nodes(plane) and not guard_present(plane)


def stack_of(plane: ControlPlane, work: Path) -> auto.Stack:
    config = {
        "pulumi:disable-default-providers": ["kubernetes"],
        "kubernetes:kubeconfig": str(plane.kubeconfig("admin")),
        "kubernetes:context": "admin@e2e",
        "hidden-gpu:nodes": [
            {"name": "gpu-node-01", "exposedGpus": [EXPOSED], "hiddenGpus": list(HIDDEN)},
            {"name": "gpu-node-02", "exposedGpus": [], "hiddenGpus": list(FULLY_HIDDEN)},
        ],
    }
    (work / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    return pulumi_stack(work, STACK)


def up_process(work: Path) -> subprocess.Popen[bytes]:
    """`up` of the stack in `work`, in a child process of its own session: a test can end it, engine and
    provider included, where an `up` in a thread of pytest would keep the interpreter from exiting."""
    script = (
        "import sys; from pathlib import Path; from tests.real.harness import pulumi_stack; "
        "pulumi_stack(Path(sys.argv[1]), sys.argv[2]).up(on_output=None)"
    )
    with (work / "up.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-c", script, str(work), STACK],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def interrupt_up_when(plane: ControlPlane, work: Path, moment: Any, what: str) -> None:
    """Run `up`; the moment `moment()` is true, SIGKILL the API server, then start it again a few seconds later,
    as a crashed control plane comes back. `up` may then fail or finish; the sampler judges every moment."""
    running = up_process(work)
    try:
        eventually(lambda: moment() or running.poll() is not None, seconds=240, what=what)
        assert running.poll() is None, f"`up` ended before {what}: {(work / 'up.log').read_text()[-2000:]}"
        plane.kill("kube-apiserver")
        time.sleep(DOWN_SECONDS)
        plane.restart("kube-apiserver")
        running.wait(UP_AFTER_RESTART_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`up` did not end {UP_AFTER_RESTART_SECONDS} s after its API server came back")
    finally:
        if running.poll() is None:
            os.killpg(running.pid, signal.SIGKILL)
            running.wait()


@pytest.mark.timeout(900)
def test_an_interrupted_first_up_never_leaves_a_hidden_node_unguarded(plane: ControlPlane, tmp_path: Path) -> None:
    stack = stack_of(plane, tmp_path)
    sampler = Sampler(plane)
    sampler.start()
    try:
        # Killed while the guard is being created: no node may be hidden yet.
        interrupt_up_when(plane, tmp_path, lambda: bool(guard_present(plane)), "the first guard object")
        # From nothing again, killed the moment a node is hidden: the guard must already be whole.
        start_over(plane, stack)
        interrupt_up_when(plane, tmp_path, lambda: bool(hidden_nodes(plane)), "the first hidden node")
        # The next `up` finishes what the two left, and a preview then has nothing to do.
        stack.up(on_output=None)
        stack.preview(expect_no_changes=True)
    finally:
        sampler.stopping.set()
        sampler.join()
    assert hidden_nodes(plane) == set(GPU_NODES)
    assert guard_present(plane) == set(GUARD)
    assert sampler.hidden_seen and sampler.samples > 20, (sampler.samples, sampler.hidden_seen)
    assert sampler.violations == [], sampler.violations[:5]
    assert_audit_order(plane)


def assert_audit_order(plane: ControlPlane) -> None:
    """From the API server's audit log: every guard object was written (2xx, response complete) before the first
    node patch, across both API server lives (the restarted one appends to the same log)."""
    guard_done: dict[str, str] = {}
    first_node_patch = None
    for line in (plane.root / "audit.log").read_text().splitlines():
        event = json.loads(line)
        ref, code = event.get("objectRef") or {}, (event.get("responseStatus") or {}).get("code", 0)
        if event.get("stage") != "ResponseComplete" or not 200 <= code < 300:
            continue
        if event.get("verb") not in ("create", "patch", "update") or ref.get("subresource"):
            continue
        # The engine's patches; the fixture's own (the operator's label, by this test's client) came before.
        ours = not event.get("userAgent", "").startswith(USER_AGENT)
        if ref.get("resource") == "nodes" and ours:
            first_node_patch = first_node_patch or event["requestReceivedTimestamp"]
        elif ref.get("resource", "").startswith("validatingadmissionpolic"):
            guard_done.setdefault(f"{ref['resource']}/{ref.get('name')}", event["stageTimestamp"])
    assert first_node_patch is not None, "no node patch in the audit log"
    assert len(guard_done) == len(GUARD), guard_done
    late = {name: done for name, done in guard_done.items() if done >= first_node_patch}
    assert not late, f"first node patch at {first_node_patch}, but {late}"
