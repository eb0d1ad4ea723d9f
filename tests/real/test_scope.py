"""guard.scope sharedNodes against the real API server and the real scheduler (issue 40): the platform taints the
stack's node; a pod the scoped guard does not judge is admitted untouched and is never scheduled there, only to the
cluster's other nodes; every way onto the shared node (tolerating its taint, naming it, a toleration added to a
Pending pod) is judged and denied.

Its own plane: the taint and the scoped guard are this module's alone. Nodes: gpu-node-01 (the stack's, tainted),
gpu-node-02 and cpu-node-01 (the cluster's others), kwok's, as in the whole tier; the scheduler is the real one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.names import SHARED_NODE_TAINT, SHARED_NODE_TAINT_EFFECT
from e2e.controlplane import ApiError, ControlPlane
from tests.real.conftest import TENANT, add_gpu_node, eventually, kwok_plane, seed
from tests.real.harness import apply_guard, rule_in
from tests.support.guard import container, pod
from tests.support.stacks import CLUSTER, EXPOSED, HIDDEN

SHARED_NODE = "gpu-node-01"
STACK = {
    **CLUSTER,
    "hidden-gpu:nodes": [{"name": SHARED_NODE, "exposedGpus": [EXPOSED], "hiddenGpus": HIDDEN}],
    "hidden-gpu:guard": {"scope": "sharedNodes"},
}
TOLERATION = {"key": SHARED_NODE_TAINT, "operator": "Exists", "effect": SHARED_NODE_TAINT_EFFECT}
SPREAD = 6  # ordinary pods at once


@pytest.fixture(scope="module")
def plane(bin_dir: Path) -> Iterator[ControlPlane]:
    with kwok_plane(bin_dir) as started:
        seed(started)
        add_gpu_node(started, "cpu-node-01", 0)
        # What the platform does (the docs' kubectl taint), keeping the node's other taints.
        found = started.request("GET", f"/api/v1/nodes/{SHARED_NODE}")
        taints = [*(found["spec"].get("taints") or []), {"key": SHARED_NODE_TAINT, "value": "true",
                                                        "effect": SHARED_NODE_TAINT_EFFECT}]  # fmt: skip
        started.request(
            "PATCH",
            f"/api/v1/nodes/{SHARED_NODE}",
            {"spec": {"taints": taints}},
            content_type="application/merge-patch+json",
        )
        apply_guard(started, STACK, probe=privileged("probe", tolerations=[TOLERATION]))
        yield started


def privileged(name: str, **spec: Any) -> dict[str, Any]:
    """A pod the guard denies wherever it judges it (privileged), in the tenant's namespace."""
    obj = pod(container(securityContext={"privileged": True}), **spec)
    obj["metadata"] = {"name": name, "namespace": TENANT}
    return obj


def on_shared_node() -> dict[str, Any]:
    """Required node affinity to the shared node by name: only its taint keeps the pod off it."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [SHARED_NODE]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def refusal(plane: ControlPlane, obj: dict[str, Any]) -> str | None:
    try:
        plane.create(obj, identity="tenant")
    except ApiError as error:
        return error.message
    return None


def tolerate(plane: ControlPlane, name: str) -> None:
    """The tenant adds the shared-node toleration to its pod (a JSON patch: the scheduler writes the pod's status
    meanwhile, so an update carrying a resourceVersion could conflict). The API server's defaults gave the pod
    tolerations already (DefaultTolerationSeconds), so the list exists."""
    plane.request(
        "PATCH",
        f"/api/v1/namespaces/{TENANT}/pods/{name}",
        [{"op": "add", "path": "/spec/tolerations/-", "value": TOLERATION}],
        identity="tenant",
        content_type="application/json-patch+json",
    )


def scheduled(plane: ControlPlane, name: str) -> dict[str, Any]:
    found: dict[str, Any] = plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods/{name}")
    return next((c for c in found["status"].get("conditions", []) if c["type"] == "PodScheduled"), {})


def test_ordinary_pods_are_admitted_untouched_and_never_land_on_the_shared_node(plane: ControlPlane) -> None:
    names = [f"ordinary-{index}" for index in range(SPREAD)]
    for name in names:
        created = plane.create(privileged(name), identity="tenant")
        (app,) = created["spec"]["containers"]
        assert app["securityContext"] == {"privileged": True} and "env" not in app, app

    def placed() -> dict[str, str] | None:
        nodes = {
            name: plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods/{name}")["spec"].get("nodeName", "")
            for name in names
        }
        return nodes if all(nodes.values()) else None

    nodes = eventually(placed, seconds=60, what="every ordinary pod bound")
    assert SHARED_NODE not in nodes.values(), nodes


def test_an_ordinary_pod_aimed_at_the_shared_node_stays_pending(plane: ControlPlane) -> None:
    assert refusal(plane, privileged("aimed", affinity=on_shared_node())) is None
    condition = eventually(lambda: scheduled(plane, "aimed") or None, seconds=60, what="the scheduler's verdict")
    assert condition["status"] == "False" and condition["reason"] == "Unschedulable", condition
    assert "1 node(s) had untolerated taint(s)" in condition["message"], condition


@pytest.mark.parametrize(
    ("reach", "rule"),
    [
        ({"tolerations": [TOLERATION]}, "privileged"),
        ({"tolerations": [{"operator": "Exists"}]}, "privileged"),
        ({"nodeName": SHARED_NODE}, "node-name"),  # the first rule it breaks
    ],
    ids=["tolerating-the-taint", "tolerating-every-taint", "naming-the-node"],
)
def test_every_pod_that_can_reach_it_is_judged(plane: ControlPlane, reach: dict[str, Any], rule: str) -> None:
    assert rule_in(refusal(plane, privileged("reaching", **reach))) == rule


def test_a_toleration_added_to_a_pending_pod_is_judged_as_its_create(plane: ControlPlane) -> None:
    """The API server lets an UPDATE add tolerations; to a Pending, out-of-scope pod that would be its way onto the
    shared node. The guard judges that update as the pod's create."""
    assert refusal(plane, privileged("waiting", affinity=on_shared_node())) is None
    with pytest.raises(ApiError) as denied:
        tolerate(plane, "waiting")
    assert rule_in(denied.value.message) == "privileged"
    # The route is real: a pod the guard admits, given the toleration so, is scheduled onto the shared node.
    calm = pod(container(), affinity=on_shared_node())
    calm["metadata"] = {"name": "calm", "namespace": TENANT}
    plane.create(calm, identity="tenant")
    tolerate(plane, "calm")
    bound = eventually(
        lambda: plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods/calm")["spec"].get("nodeName"),
        seconds=60,
        what="the tolerating pod bound",
    )
    assert bound == SHARED_NODE
