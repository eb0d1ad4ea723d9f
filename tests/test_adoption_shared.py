"""Replacing a hand-made plugin DaemonSet that serves several nodes by GPU index (issue 42, 4), in the fast tier: what
the program declares for a node that names it `shared`, what a stack may not ask, what verify says of it, and the
wait every pinned plugin makes, run by this machine's `sh`. tests/node/test_takeover_shared.py runs it on a real
kubelet."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cluster.adoption import LEAVES, check_adoption, terms_staying
from cluster.live import Live
from common.names import DEFAULT_PLUGIN_NAMESPACE, KUBELET_DEVICE_PLUGINS, NODE_LABEL, PLUGIN_WAIT_CONTAINER
from desired.device_plugin import WAIT_SCRIPT
from offline.program import run_program
from policy.rules import RESOURCE_VALIDATORS, plugin_devices_are_uuids
from stack_config import InvalidConfigError, parse_project_config
from tests.support.objects import plugins
from tests.support.policy_pack import Collected, resource_args
from tests.support.stacks import FULLY_HIDDEN, changed, node

SHARED: dict[str, Any] = {"namespace": "kube-system", "name": "nvidia-device-plugin-by-index", "shared": True}


def adopting(first: dict[str, Any] | None, second: dict[str, Any] | None) -> dict[str, Any]:
    """Both nodes expose a GPU; each names the hand-made DaemonSet as given (None: not at all)."""

    def change(config: dict[str, Any]) -> None:
        node(config, 1).update(exposedGpus=[FULLY_HIDDEN[0]], hiddenGpus=[FULLY_HIDDEN[1]])
        for index, adopt in enumerate((first, second)):
            if adopt is not None:
                node(config, index)["adoptDevicePlugin"] = adopt

    return changed(change)


def sharing(**overrides: Any) -> dict[str, Any]:
    """Both nodes name the one hand-made DaemonSet, shared."""
    return adopting({**SHARED, **overrides}, {**SHARED, **overrides})


def plain() -> dict[str, Any]:
    return adopting(None, None)


def test_a_shared_daemonset_is_not_taken_over_and_every_plugin_waits_for_the_one_it_replaces() -> None:
    """The node's own plugin, exactly as without the adoption (name, namespace, selector, no forced apply); like
    every pinned plugin, it starts only after an init container saw no other NVIDIA plugin socket."""
    before, after = (sorted(plugins(run_program(c, "test")), key=lambda r: r.name) for c in (plain(), sharing()))
    assert [(r.name, r.inputs) for r in after] == [(r.name, r.inputs) for r in before]  # no URN moves, no diff
    for plugin in after:
        metadata, pod = plugin.inputs["metadata"], plugin.inputs["spec"]["template"]["spec"]
        assert metadata["namespace"] == DEFAULT_PLUGIN_NAMESPACE
        assert "pulumi.com/patchForce" not in metadata.get("annotations", {})
        (wait,) = pod["initContainers"]
        assert wait["name"] == PLUGIN_WAIT_CONTAINER and wait["image"] == pod["containers"][0]["image"]
        assert wait["command"] == ["/bin/sh", "-c", WAIT_SCRIPT]
        # It reads no GPU and only reads the kubelet's directory.
        assert wait["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
        security = wait["securityContext"]
        assert security["privileged"] is False and security["capabilities"]["drop"] == ["ALL"]
        mount = {"name": "device-plugin", "mountPath": KUBELET_DEVICE_PLUGINS, "readOnly": True}
        assert wait["volumeMounts"] == [mount]
    # `$(` would be read by the kubelet as a variable reference.
    assert "$(" not in WAIT_SCRIPT


@pytest.mark.parametrize(
    ("config", "where", "reason"),
    [
        (
            sharing(matchLabels={"name": "x"}),
            "nodes[0].adoptDevicePlugin.matchLabels",
            "not with shared: true",
        ),
        (sharing(container="ctr"), "nodes[0].adoptDevicePlugin.container", "not with shared: true"),
        (
            adopting({**SHARED, "shared": False}, None),
            "nodes[0].adoptDevicePlugin.matchLabels",
            "required: the taken-over DaemonSet keeps it",
        ),
        (
            adopting(SHARED, {**SHARED, "shared": False, "matchLabels": {"name": "x"}, "container": "ctr"}),
            "nodes[1].adoptDevicePlugin.name",
            "also adopted by nodes[0]: a DaemonSet taken over is one node's plugin",
        ),
        (sharing(namespace="ml-team"), "nodes[0].adoptDevicePlugin.namespace", "not exempt from the guard"),
    ],
    ids=["match-labels", "container", "taken-over-needs-its-selector", "shared-and-taken", "namespace-not-exempt"],
)
def test_what_a_shared_adoption_may_not_ask(config: dict[str, Any], where: str, reason: str) -> None:
    with pytest.raises(InvalidConfigError) as raised:
        parse_project_config(config)
    assert f"hidden-gpu:{where}" in str(raised.value) and reason in str(raised.value), str(raised.value)


def test_one_node_may_name_a_shared_daemonset_alone() -> None:
    """The other nodes it serves need not be in this stack (another stack's, or not shared at all)."""
    (only,) = [n for n in parse_project_config(sharing()).nodes if n.shared_plugin is not None][:1]
    alone = adopting(SHARED, None)
    assert parse_project_config(alone).nodes[0].shared_plugin == only.shared_plugin


def hand_made(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": expressions} for expressions in terms]}}} if terms else None  # fmt: skip
    return {
        "spec": {"selector": {"matchLabels": {"name": SHARED["name"]}}, "template": {"spec": {"affinity": affinity}}}
    }


LEAVING = {"key": NODE_LABEL, "operator": "DoesNotExist"}
GPU_NODES = {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}


def test_which_terms_keep_the_hand_made_pods_on_hidden_gpus_nodes() -> None:
    assert terms_staying(hand_made([GPU_NODES, LEAVING], [LEAVING])) == []
    # Terms are ORed: one without the expression keeps the pods on every node it matches.
    assert terms_staying(hand_made([GPU_NODES, LEAVING], [GPU_NODES])) == [1]
    assert terms_staying(hand_made([{**LEAVING, "operator": "Exists"}])) == [0]
    assert terms_staying(hand_made()) == [-1]


def live(daemon_set: dict[str, Any] | None, pods: list[dict[str, Any]]) -> Live:
    empty: dict[str, Any] = {f.name: [] if "list" in str(f.type) else {} for f in dataclasses.fields(Live)}
    key = (SHARED["namespace"], SHARED["name"])
    return Live(**empty | {"adopted": {key: daemon_set}, "shared_pods": {key: pods}})


def pod_on(node_name: str, name: str = "by-index-abcde") -> dict[str, Any]:
    owner = {"kind": "DaemonSet", "name": SHARED["name"], "controller": True}
    return {"metadata": {"name": name, "ownerReferences": [owner]}, "spec": {"nodeName": node_name}}


def test_verify_names_the_hand_made_pod_still_on_the_node_and_the_term_to_add() -> None:
    stack = parse_project_config(sharing())
    first = stack.nodes[0]
    moved_off = live(hand_made([GPU_NODES, LEAVING]), [pod_on("gpu-node-03")])
    assert [(c.what, c.actual, c.ok) for c in check_adoption(first, moved_off)] == [
        (f"shared {SHARED['namespace']}/{SHARED['name']} leaves hidden-gpu's nodes", LEAVES, True),
        (f"shared {SHARED['namespace']}/{SHARED['name']} pods on the node", "0", True),
    ]
    staying = list(check_adoption(first, live(hand_made([GPU_NODES]), [pod_on("gpu-node-01")])))
    assert not staying[0].ok and "not in terms [0]: add {key: hidden-gpu.io/node, operator: DoesNotExist}" in (
        staying[0].actual
    )
    assert (staying[1].ok, staying[1].actual) == (False, "1 (by-index-abcde)")
    # Gone once no node needs it: nothing to check but that none of its pods stayed.
    assert [c.ok for c in check_adoption(first, live(None, []))] == [True]


def test_the_wait_holds_while_a_plugin_socket_is_there_and_ends_when_it_goes(tmp_path: Path) -> None:
    """Driven: the socket is there, the wait runs on; it goes, the wait ends at once (within its 1 s poll)."""
    script = WAIT_SCRIPT.replace(KUBELET_DEVICE_PLUGINS, str(tmp_path))
    (tmp_path / "kubelet.sock").touch()  # the kubelet's own is not a plugin's
    socket = tmp_path / "nvidia-gpu.sock"
    socket.touch()
    waiting = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        assert waiting.poll() is None
        socket.unlink()
        out, _ = waiting.communicate(timeout=5)
    finally:
        waiting.kill()
    assert waiting.returncode == 0
    lines = out.splitlines()
    assert len(lines) == 2 and f"waiting for {socket} to go" in lines[0] and "delete it" in lines[0]
    assert "the pinned plugin starts" in lines[1]


def test_the_policy_pack_passes_the_waiting_plugin_and_still_refuses_an_index() -> None:
    """The init container says `void` (no GPU), which the pack's UUID rule lets through; an index never."""
    run = run_program(sharing(), "test")
    for resource in run.kubernetes_objects:
        for _, validator in RESOURCE_VALIDATORS.values():
            found = Collected()
            validator(resource_args(resource.type, resource.inputs), found)
            assert list(found) == [], resource.name
    plugin = sorted(plugins(run), key=lambda r: r.name)[0]
    props = copy.deepcopy(plugin.inputs)
    props["spec"]["template"]["spec"]["initContainers"][0]["env"][0]["value"] = "0"
    found = Collected()
    plugin_devices_are_uuids(resource_args(plugin.type, props), found)
    assert len(list(found)) == 1 and "GPU or MIG UUIDs only" in next(iter(found))
