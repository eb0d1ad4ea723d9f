"""Allocated DRA claims through the real kubelet and runtime (issues 31 and 41): the render's DRA kubelet plugin,
pinned to the node's exposed GPU, runs as its DaemonSet under the node's RuntimeClass, learns its GPUs from what its
container was given, registers with this node's kubelet and publishes that GPU alone; no hidden UUID is anywhere in
the API. The real scheduler allocates tenants' claims of the stack's DeviceClass; the kubelet has the plugin prepare
them and hands their CDI devices to containerd, which injects them; the container prints what it got. Then the
control: NVIDIA's plugin as its chart runs it (privileged: every GPU), where the guard does not judge (kube-system),
hands out a hidden GPU, which host.audit reports from the kubelet's PodResources `dynamic_resources`.

The stand-ins: NVIDIA's DRA kubelet plugin (e2e/go/dra, on the DRA helper library NVIDIA's driver uses), in the
rendered DaemonSet with its image replaced and, as the node tier has no Service network, the host's network and the
API server's address given; the node's CDI spec (a GPU is a marker); NVML in host.audit (a host record)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.names import DEFAULT_PLUGIN_NAMESPACE, DRA_API_PATH, NVIDIA_DRA_DRIVER, dra_plugin_name
from e2e.controlplane import ControlPlane, naming
from e2e.node import Node
from e2e.node_dra import DRA_DRIVER, claim_results, dra_devices, grant_dra_driver, on_host_network, using_claim
from e2e.node_gpus import Toolkit
from tests.node.conftest import (
    GPU,
    NODE,
    TENANT,
    apply_render,
    clear_plugin_namespace,
    eventually,
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
from tests.support.routes import claim, exactly
from tests.support.stacks import EXPOSED, HIDDEN, write_stack

# The node's GPUs in minor-number order, as its CDI spec and the host record list them (tests/node/conftest.py).
GPUS = [EXPOSED, *HIDDEN]
CLAIMS = 3  # more than the one exposed GPU, created at once
EXEMPT = "kube-system"
PINNED = dra_plugin_name(NODE)
# NVIDIA's own class, as its chart creates it: every device of the driver.
NVIDIA_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": NVIDIA_DRA_DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NVIDIA_DRA_DRIVER}'"}}]},
}


def config() -> dict[str, Any]:
    """The node's exposed GPU handed out by DRA alone (`allocator: dra`): the render runs no device plugin."""
    written = stack("envvar")
    written["hidden-gpu:nodes"] = [{**n, "allocator": "dra"} for n in written["hidden-gpu:nodes"]]
    return {**written, "hidden-gpu:dra": {}}


@pytest.fixture(scope="module")
def gpu_class(node_plane: ControlPlane, node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The render with the guard applied on a node no device plugin serves (earlier modules' plugins deleted), NVIDIA's
    class beside it, the pinned DRA plugin Ready and its slice published; yields the stack's DeviceClass for the
    node."""
    objects = rendered_objects(tmp_path_factory.mktemp("dra"), "envvar", guard=True, config=config())
    (device_class,) = [o["metadata"]["name"] for o in objects if o["kind"] == "DeviceClass"]
    daemon_sets = [o["metadata"]["name"] for o in objects if o["kind"] == "DaemonSet"]
    assert PINNED in daemon_sets and not [n for n in daemon_sets if "device-plugin" in n], daemon_sets
    clear_plugin_namespace(node_plane)
    node.toolkit(Toolkit())  # the toolkit's defaults (an earlier module may have hardened it)
    eventually(lambda: node.allocatable(GPU) == 0, "no nvidia.com/gpu allocatable")
    apply_render(
        node_plane,
        [
            on_host_network(o, node_plane) if o["metadata"]["name"] == PINNED and o["kind"] == "DaemonSet" else o
            for o in objects
        ],
    )
    node_plane.apply(NVIDIA_CLASS, manager="nvidia-dra-driver-chart")
    eventually(lambda: published(node_plane) == {f"gpu-{GPUS.index(EXPOSED)}": EXPOSED}, "the pinned plugin's slice")
    eventually(
        lambda: "hidden-gpu guard" in (denial(node_plane, claim(exactly(NVIDIA_DRA_DRIVER)), identity="admin") or ""),
        "the claims policy in force",
    )
    yield device_class
    for namespace in (TENANT, EXEMPT):
        for prefix, kind in (("/api/v1", "pods"), (DRA_API_PATH, "resourceclaims")):
            node_plane.request("DELETE", f"{prefix}/namespaces/{namespace}/{kind}?labelSelector=test%3Ddra")
    # The resource claim controller releases the pods' claims, then lets them go: the GPUs are free again.
    eventually(lambda: not dra_pods(node_plane) and not dra_claims(node_plane), "the DRA pods and claims gone")
    node.stop_dra_plugin()
    clear_plugin_namespace(node_plane)
    # The stopped plugin's slice (the kubelet would wipe it only later): later modules' verify reads slices.
    node_plane.request("DELETE", f"{DRA_API_PATH}/resourceslices?fieldSelector=spec.nodeName%3D{NODE}")
    eventually(lambda: not published(node_plane), "this node's slices gone")
    for obj in [*(o for o in objects if o["kind"] == "DeviceClass"), NVIDIA_CLASS]:
        node_plane.request("DELETE", node_plane.path(obj))
    remove_guard(node_plane, objects)


def published(plane: ControlPlane) -> dict[str, str]:
    """This node's devices of NVIDIA's driver in its slices: device name (gpu-<minor>) -> UUID."""
    return dra_devices(plane, NODE, NVIDIA_DRA_DRIVER)


def labelled(plane: ControlPlane, prefix: str, kind: str) -> list[dict[str, Any]]:
    return [
        item
        for namespace in (TENANT, EXEMPT)
        for item in plane.request("GET", f"{prefix}/namespaces/{namespace}/{kind}?labelSelector=test%3Ddra")["items"]
    ]


def dra_pods(plane: ControlPlane) -> list[dict[str, Any]]:
    return labelled(plane, "/api/v1", "pods")


def dra_claims(plane: ControlPlane) -> list[dict[str, Any]]:
    return labelled(plane, DRA_API_PATH, "resourceclaims")


def claim_pod(name: str, claim_name: str, namespace: str = TENANT) -> dict[str, Any]:
    """A sleeping probe whose one container uses the claim `claim_name` (e2e.node.using_claim: no RuntimeClass)."""
    pod = using_claim(probe_pod(name, sleep=True), claim_name)
    pod["metadata"] |= {"namespace": namespace, "labels": {"test": "dra"}}
    return pod


def new_claim(plane: ControlPlane, name: str, device_class: str, namespace: str = TENANT) -> None:
    obj = claim(exactly(device_class, name="gpu"))
    obj["metadata"] = {"name": name, "namespace": namespace, "labels": {"test": "dra"}}
    plane.create(obj)


def allocated_uuids(plane: ControlPlane, namespace: str, name: str) -> list[str]:
    results = claim_results(plane, namespace, name)
    return [GPUS[int(r["device"].split("-")[1])] for r in results if r["driver"] == NVIDIA_DRA_DRIVER]


def test_the_pinned_plugin_publishes_the_exposed_gpu_alone(node_plane: ControlPlane, gpu_class: str) -> None:
    """Its container was given the exposed GPU alone (the rendered DaemonSet: unprivileged, NVIDIA_VISIBLE_DEVICES,
    the node's RuntimeClass): one pool named after the node, one device `gpu-<minor>` of type gpu, owned by the Node;
    the pod Ready by the rendered gRPC probes."""
    query = f"{DRA_API_PATH}/resourceslices?fieldSelector=spec.nodeName%3D{NODE}"
    (piece,) = [s for s in node_plane.request("GET", query)["items"] if s["spec"]["driver"] == NVIDIA_DRA_DRIVER]
    assert piece["spec"]["pool"]["name"] == NODE
    assert [d["name"] for d in piece["spec"]["devices"]] == [f"gpu-{GPUS.index(EXPOSED)}"]
    assert {d["attributes"]["type"]["string"] for d in piece["spec"]["devices"]} == {"gpu"}
    assert [(o["kind"], o["name"]) for o in piece["metadata"]["ownerReferences"]] == [("Node", NODE)]

    def ready() -> dict[str, Any] | None:
        pods = node_plane.request("GET", f"/api/v1/namespaces/{DEFAULT_PLUGIN_NAMESPACE}/pods")["items"]
        (pod,) = [p for p in pods if p["metadata"]["name"].startswith(PINNED)]
        conditions = pod["status"].get("conditions", [])
        return pod if [c["status"] for c in conditions if c["type"] == "Ready"] == ["True"] else None

    pod = eventually(ready, "the pinned plugin's pod Ready (its startup probe passed)")
    assert pod["spec"]["containers"][0]["securityContext"]["privileged"] is False


def test_no_hidden_uuid_is_anywhere_in_the_api(node_plane: ControlPlane, gpu_class: str) -> None:
    """Every object of every listable resource of the API server, read as JSON: no hidden GPU's UUID in any (the
    exposed one is in the slice, so the search can find what it looks for)."""
    found = naming(node_plane, GPUS)
    assert EXPOSED in found["resourceslices"]
    assert {name: uuids for name, uuids in found.items() if set(uuids) & set(HIDDEN)} == {}


def test_claims_of_the_stack_class_get_the_exposed_gpu_only(
    node_plane: ControlPlane, node: Node, gpu_class: str, tmp_path: Path
) -> None:
    """Three claims and their pods at once, for the one exposed GPU, and two pods asking for `nvidia.com/gpu` beside
    them (issue 40, 2: with a plugin and a class of the same GPU, the real scheduler bound one of each): one claim's
    pod runs and sees exactly the GPU, through the kubelet's DRA manager, the plugin's prepare and containerd's CDI
    injection; every other pod stays Pending, the plugin-resource ones for want of `nvidia.com/gpu`. Then
    host.audit reads the allocation from the kubelet and finds it clean."""
    names = [f"dra-{i}" for i in range(CLAIMS)]
    for name in names:
        new_claim(node_plane, name, gpu_class)
    for name in names:
        node_plane.create(claim_pod(name, name))
    for index in range(2):
        extended = probe_pod(f"plugin-resource-{index}", gpus=1, sleep=True)
        extended["metadata"]["labels"] = {"test": "dra"}
        node_plane.create(extended)

    def settled() -> dict[str, list[str]]:
        allocations = {name: allocated_uuids(node_plane, TENANT, name) for name in names}
        pending = [
            p["metadata"]["name"]
            for p in dra_pods(node_plane)
            if any(c["type"] == "PodScheduled" and c["status"] == "False" for c in p["status"].get("conditions", []))
        ]
        done = sum(1 for a in allocations.values() if a) == 1 and len(pending) == CLAIMS - 1 + 2
        assert done, (allocations, pending, node.log("dra-plugin")[-1500:])
        return allocations

    allocations = eventually(settled, "one claim allocated, the other pods unschedulable")
    bound = [p["metadata"]["name"] for p in dra_pods(node_plane) if p["spec"].get("nodeName")]
    assert len(bound) == 1, bound  # the node exposes one GPU: one pod of five, whichever allocator it asked
    for index in range(2):
        extended = node_plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods/plugin-resource-{index}")
        (scheduled,) = [c for c in extended["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert f"Insufficient {GPU}" in scheduled.get("message", ""), scheduled
    (holder,) = [name for name, uuids in allocations.items() if uuids]
    assert allocations[holder] == [EXPOSED]
    lines = eventually(
        lambda: "done" in (printed := node.logs(TENANT, holder)) and printed, f"pod {holder} printed its view"
    )
    assert seen(lines) == {EXPOSED}, lines

    # The holder's process on its GPU: clean only if the audit read the kubelet's DRA allocation (without it, "a pod
    # uses a GPU the kubelet did not allocate to it").
    pod = node_plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods/{holder}")
    pid = probe_pid(pod["metadata"]["uid"])
    status, out = run_audit(node, tmp_path, write_stack(tmp_path, config(), name="node"), GPUS, {EXPOSED: pid})
    assert status == 0, out
    assert f"pid {pid}: pod {TENANT}/{holder} container probe" in out, out


def test_where_the_guard_does_not_judge_only_nvidias_own_plugin_reaches_a_hidden_gpu(
    node_plane: ControlPlane, node: Node, gpu_class: str, tmp_path: Path
) -> None:
    """NVIDIA's class from a tenant namespace: denied by the claims policy. In an exempt namespace the claim is
    admitted, and with the pinned plugin nothing can be allocated to it (the exposed GPU is taken, no other is
    published). The control: the pinned plugin gone and NVIDIA's plugin as its chart runs it (privileged, every
    GPU) in its place; the allocator gives the claim a hidden GPU, the container sees it, and host.audit reports the
    pod and its claim from the kubelet's dynamic_resources."""
    assert rule_in(denial(node_plane, claim(exactly(NVIDIA_DRA_DRIVER)), identity="admin")) == "claim-device-classes"
    new_claim(node_plane, "everything", NVIDIA_DRA_DRIVER, namespace=EXEMPT)
    node_plane.create(claim_pod("everything", "everything", namespace=EXEMPT))
    pod = f"/api/v1/namespaces/{EXEMPT}/pods/everything"
    eventually(
        lambda: any(
            c["type"] == "PodScheduled" and c["status"] == "False"
            for c in node_plane.request("GET", pod)["status"].get("conditions", [])
        ),
        "the exempt claim's pod unschedulable",
    )
    assert allocated_uuids(node_plane, EXEMPT, "everything") == []
    node_plane.request("DELETE", pod)
    eventually(lambda: node_plane.get_or_none(pod) is None, "the unschedulable pod gone")

    node_plane.request("DELETE", f"/apis/apps/v1/namespaces/{DEFAULT_PLUGIN_NAMESPACE}/daemonsets/{PINNED}")
    eventually(lambda: not published(node_plane), "the pinned plugin's slice gone")
    grant_dra_driver(node_plane)
    node.start_dra_plugin(node_plane.kubeconfig(DRA_DRIVER), NVIDIA_DRA_DRIVER, GPUS)
    eventually(lambda: len(published(node_plane)) == len(GPUS), "NVIDIA's plugin's slice: every GPU")
    result = run_probe(node_plane, node, claim_pod("everything", "everything", namespace=EXEMPT))
    (uuid,) = allocated_uuids(node_plane, EXEMPT, "everything")
    assert uuid in HIDDEN
    assert seen(result["lines"]) == {uuid}, result["lines"]

    status, out = run_audit(node, tmp_path, write_stack(tmp_path, config(), name="node"), GPUS, {})
    assert status == 1, out
    assert f"the kubelet gave pod {EXEMPT}/everything container probe a hidden GPU through DRA claim" in out, out
