"""The seed recipe end to end on the real node, against the GPU Operator's own device plugin (issue 38, 4): NVIDIA's
operator controller (e2e/gpu_operator.py) deploys its device-plugin DaemonSet to the real kubelet, its image pointed
by the ClusterPolicy (`devicePlugin` repository, image, version, pull policy Never) at the stand-in plugin with the
operator's own `NVIDIA_VISIBLE_DEVICES=all`: the node advertises every GPU of its synthetic CDI spec. Then `pulumi
up` of a stack exposing one of them; sampled every 100 ms throughout: allocatable never above the node's GPUs, never
two plugin containers running at once, ending at the exposed count. Then `destroy` and `cluster.release`: the
operator's plugin back, every GPU advertised again.

The operator's pod runs what its DaemonSet says (`/bin/bash -c /bin/entrypoint.sh`, the operator's script, a
privileged container of the runtime class `nvidia`, an init container in the validator's image). The stand-ins are
the images (e2e/images.py: this machine's bash, cat and sh, the stand-in plugin as `nvidia-device-plugin`) and the
validator's status files the script waits for, written here as the operator's validator writes them."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi import automation as auto

from cluster import release
from common.cli import EXIT_OK
from common.names import (
    CLUSTER_POLICIES_PATH,
    DEPLOY_LABEL_PREFIX,
    DEVICE_PLUGIN_LABEL,
    OPERAND_LABELS,
    STACK_LABEL,
)
from e2e import gpu_operator
from e2e.controlplane import ApiError, ControlPlane
from e2e.images import DCGM_EXPORTER, OPERATOR_PLUGIN, OPERATOR_VALIDATOR, PLUGIN
from e2e.node import Node
from e2e.node_gpus import Toolkit
from tests.node.conftest import NODE, Sampler, clear_plugin_namespace, delete_guard, eventually, stack
from tests.real.harness import Stopwatch, pulumi_stack
from tests.support.stacks import EXPOSED, HIDDEN

ALL = 1 + len(HIDDEN)  # the synthetic spec's GPUs: the stack's exposed and hidden UUIDs
VALIDATIONS = Path("/run/nvidia/validations")
# The ClusterPolicy sections turned off: every operand but the device plugin (and the validator, which has no switch).
OFF = ("driver", "toolkit", "gfd", "dcgm", "dcgmExporter", "migManager", "nodeStatusExporter")
TIMES = Stopwatch("gpu-operator-node")


def _image(image: str) -> dict[str, str]:
    repository, rest = image.rsplit("/", 1)
    name, version = rest.split(":")
    return {"repository": repository, "image": name, "version": version, "imagePullPolicy": "Never"}


def shared_root() -> bool:
    """Whether / is a shared mount. containerd refuses a HostToContainer hostPath on a private one (its CRI plugin's
    ensureSharedOrSlave), and the operator's plugin mounts / and /run/nvidia so; systemd makes / shared at boot."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return any(f.startswith("shared:") for f in fields[6 : fields.index("-")])
    return False


@contextlib.contextmanager
def gpu_node_host() -> Iterator[None]:
    """The host as the operator's pods find a GPU node: the validator's status files (the operator's validator writes
    them once the driver and toolkit check out; none runs here) and / shared. Both undone afterwards."""
    made = not VALIDATIONS.parent.exists()
    was_shared = shared_root()
    VALIDATIONS.mkdir(parents=True, exist_ok=True)
    (VALIDATIONS / "toolkit-ready").write_text("")
    (VALIDATIONS / "driver-ready").write_text("IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\n")
    if not was_shared:
        subprocess.run(["mount", "--make-rshared", "/"], check=True)
    try:
        yield
    finally:
        if not was_shared:
            subprocess.run(["mount", "--make-rprivate", "/"], check=False)
        for name in ("toolkit-ready", "driver-ready"):
            (VALIDATIONS / name).unlink(missing_ok=True)
        if made:
            subprocess.run(["rm", "-rf", str(VALIDATIONS.parent)], check=False)


@pytest.fixture(scope="module")
def operator(node_plane: ControlPlane, node: Node) -> Iterator[Path]:
    node.toolkit(Toolkit())
    clear_plugin_namespace(node_plane)  # what earlier modules left: their plugin and operands
    # And the stack records the modules that applied a render by hand left: this module's stack is the node's only.
    for record in node_plane.request("GET", f"/api/v1/configmaps?labelSelector={STACK_LABEL}")["items"]:
        metadata = record["metadata"]
        node_plane.request("DELETE", f"/api/v1/namespaces/{metadata['namespace']}/configmaps/{metadata['name']}")
    # The node as NFD labels a GPU node, with none of hidden-gpu's switches from earlier modules. Only the operator's
    # plugin runs here: its other operands are disabled in the ClusterPolicy, the validator (which has no such
    # switch) by its node label, which the operator honours.
    current = node.node()["metadata"].get("labels") or {}
    stale = {k: None for k in current if k.startswith((DEPLOY_LABEL_PREFIX, "hidden-gpu.io/"))}
    node_plane.request(
        "PATCH",
        f"/api/v1/nodes/{NODE}?fieldManager=nfd",
        {"metadata": {"labels": {**stale, **gpu_operator.NFD_LABELS}}},
        content_type="application/merge-patch+json",
    )
    node_plane.request(
        "PATCH",
        f"/api/v1/nodes/{NODE}?fieldManager=kubectl-label",
        {"metadata": {"labels": {OPERAND_LABELS["operator_validator"]: "false"}}},
        content_type="application/merge-patch+json",
    )
    module = gpu_operator.module_dir()
    # The operator's pods mount a service-account token; the node tier runs no root-CA publisher (the controller
    # that puts this ConfigMap in every namespace), so it is written as that controller writes it.
    with contextlib.suppress(ApiError):  # an earlier run's
        node_plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": gpu_operator.NAMESPACE}})
    with contextlib.suppress(ApiError):
        node_plane.request(
            "POST",
            f"/api/v1/namespaces/{gpu_operator.NAMESPACE}/configmaps",
            {
                "metadata": {"name": "kube-root-ca.crt"},
                "data": {"ca.crt": (node_plane.root / "pki/ca.crt").read_text()},
            },
        )
    with gpu_node_host():
        gpu_operator.install(
            node_plane,
            module,
            devicePlugin={"enabled": True, **_image(OPERATOR_PLUGIN.name)},
            validator=_image(OPERATOR_VALIDATOR.name),
            **{section: {"enabled": False} for section in OFF},
        )
        gpu_operator.start(node_plane, module)
        try:
            yield module
        finally:
            node_plane.kill(gpu_operator.PROCESS) if gpu_operator.PROCESS in node_plane.processes else None
            with contextlib.suppress(ApiError):
                node_plane.request("DELETE", f"{CLUSTER_POLICIES_PATH}/{gpu_operator.CLUSTER_POLICY}")
            eventually(lambda: not gpu_operator.plugin_pods(node_plane), "the operator's plugin pods gone")
            leave_the_node(node_plane, node)


def leave_the_node(plane: ControlPlane, node: Node) -> None:
    """What this module put on the session's node goes, whether or not its test passed: the stack's plugin, guard
    and record (a failed test never reached its destroy), and the labels and record the operator and the stack set."""
    clear_plugin_namespace(plane)
    delete_guard(plane)
    for record in plane.request("GET", f"/api/v1/configmaps?labelSelector={STACK_LABEL}")["items"]:
        metadata = record["metadata"]
        plane.request("DELETE", f"/api/v1/namespaces/{metadata['namespace']}/configmaps/{metadata['name']}")
    current = node.node()["metadata"]
    ours = ("nvidia.com/", "hidden-gpu.io/", "feature.node.kubernetes.io/")
    stale = {k: None for k in current.get("labels") or {} if k.startswith(ours)}
    annotations = {k: None for k in current.get("annotations") or {} if k.startswith("hidden-gpu.io/")}
    plane.request(
        "PATCH",
        f"/api/v1/nodes/{NODE}",
        {"metadata": {"labels": stale, "annotations": annotations}},
        content_type="application/merge-patch+json",
    )


def advertises(plane: ControlPlane, node: Node, count: int) -> bool:
    """The node's allocatable is `count`; else an AssertionError with the operator's plugin pod's state."""
    if node.allocatable() == count:
        return True
    pods = plane.request("GET", f"/api/v1/namespaces/{gpu_operator.NAMESPACE}/pods")["items"]
    states = [(p["metadata"]["name"], p["status"].get("phase"), p["status"].get("initContainerStatuses"),
               p["status"].get("containerStatuses")) for p in pods]  # fmt: skip
    events = [
        e.get("message") for e in plane.request("GET", f"/api/v1/namespaces/{gpu_operator.NAMESPACE}/events")["items"]
    ]
    raise AssertionError(
        f"allocatable {node.allocatable()}, registered {registered(node)}; pods {states}; {events[-5:]}"
    )


def margin(log: str, first: int, second: int) -> float:
    """Seconds between the kubelet log lines at these offsets (klog's `I1205 13:02:04.678527` stamps)."""

    def stamp(offset: int) -> float:
        clock = log[log.rfind("\n", 0, offset) + 1 :].split()[1]
        hours, minutes, seconds = clock.split(":")
        return int(hours) * 3600 + int(minutes) * 60 + float(seconds)

    return round(stamp(second) - stamp(first), 2)


def registered(node: Node) -> list[str]:
    return list(node.checkpoint().get("RegisteredDevices", {}).get("nvidia.com/gpu") or [])


def test_the_operators_plugin_advertises_every_gpu_then_up_leaves_only_the_exposed_one(
    node_plane: ControlPlane, node: Node, operator: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    eventually(lambda: NODE in gpu_operator.plugin_pods(node_plane), "the operator's plugin pod on the node")
    eventually(lambda: advertises(node_plane, node, ALL), f"all {ALL} GPUs advertised by the operator's plugin")
    assert sorted(registered(node)) == sorted([EXPOSED, *HIDDEN])

    work = tmp_path_factory.mktemp("pulumi")
    config: dict[str, Any] = stack("envvar")
    config["hidden-gpu:devicePlugin"]["image"] = PLUGIN.name  # the stand-ins' images, imported on the node
    config["hidden-gpu:devicePlugin"]["dcgmExporterImage"] = DCGM_EXPORTER.name
    config["kubernetes:kubeconfig"] = str(node_plane.kubeconfig("admin"))
    (work / "Pulumi.operatorup.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    deployed = pulumi_stack(work, "operatorup")
    log_from = len(node.log("kubelet"))
    sampler = Sampler(node_plane, images=(PLUGIN.name, OPERATOR_PLUGIN.name))
    sampler.start()
    try:
        deployed.up(on_output=None)
        eventually(lambda: node.allocatable() == 1 and registered(node) == [EXPOSED], "only the exposed GPU")
        # The end state as the sampler reads it from the API too (the node's status and the old pod's end reach the
        # API after the kubelet has them): stopping at the kubelet's word alone could leave it unsampled.
        eventually(
            lambda: any(gpus == 1 and len(pods) == 1 for _, gpus, pods in sampler.samples), "the end state sampled"
        )
    finally:
        sampler.stopping.set()
        sampler.join()
    counts = [gpus for _, gpus, _ in sampler.samples]
    both = [(t, pods) for t, _, pods in sampler.samples if len(pods) > 1]
    TIMES.update(samples=len(counts), max_allocatable=max(counts), zero_samples=counts.count(0))
    TIMES["up, from the first sample to the exposed count alone"] = next(
        t for t, gpus, pods in sampler.samples if gpus == 1 and len(pods) == 1
    )
    assert max(counts) <= ALL and counts[-1] == 1, counts
    assert not both, f"two plugin containers running at once: {both[:5]}"
    # Never two plugins registered at once, in the kubelet's own words: the operator's plugin's stream ended before
    # the pinned plugin registered, once. Nothing in the product orders the two (Pulumi creates the pinned
    # DaemonSet once the node patch is applied; the kubelet stops the operator's plugin on its own time): the
    # margin is measured and recorded, and docs/operations.md says what would strand the node were it reversed.
    log = node.log("kubelet")[log_from:]
    ended, registered_at = log.find("ListAndWatch ended unexpectedly"), log.find("Got registration request")
    assert log.count("Got registration request from device plugin") == 1, log[-3000:]
    assert 0 <= ended < registered_at, log[-3000:]
    TIMES["old plugin's stream end to the pinned plugin's registration"] = margin(log, ended, registered_at)

    with_release(node_plane, node, deployed, work)


def with_release(node_plane: ControlPlane, node: Node, deployed: auto.Stack, work: Path) -> None:
    """destroy (the node patch retained: still hidden), then release: the operator's plugin back, every GPU."""
    deployed.destroy(on_output=None)
    delete_guard(node_plane)
    assert node.node()["metadata"]["labels"][DEVICE_PLUGIN_LABEL] == "false"
    other = work / "Pulumi.other.yaml"
    config = yaml.safe_load((work / "Pulumi.operatorup.yaml").read_text())["config"]
    config["hidden-gpu:nodes"] = [{**config["hidden-gpu:nodes"][0], "name": "another-node"}]
    other.write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    started = time.monotonic()
    assert release.main(["--stack-file", str(other), "--node", NODE, "--yes"]) == EXIT_OK
    eventually(lambda: node.allocatable() == ALL, f"all {ALL} GPUs advertised again by the operator's plugin")
    TIMES["release to every GPU advertised by the operator's plugin"] = round(time.monotonic() - started, 1)
    TIMES.record()
