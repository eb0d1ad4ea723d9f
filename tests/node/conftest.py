"""The node tier's fixtures: a control plane (e2e.controlplane, with the node lifecycle controller) and one real
node registered to it (e2e.node: containerd, runc, NVIDIA's container runtime in CDI mode over a synthetic
spec, a kubelet), started once per session; a small stack rendered by this program and applied to it by
server-side apply of the render's objects.

Marked `real` (make e2e runs them after tests/real; make test deselects them). Needs root and the binaries
python -m e2e.build links into e2e/.bin."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.names import (
    CLAIMS_POLICY_NAME,
    ENV_KEYS_POLICY_NAME,
    NODE_SWITCHES_POLICY_NAME,
    POLICY_NAME,
    PROVIDER_ANNOTATION_PREFIX,
    device_plugin_name,
    dra_plugin_name,
    pinned_operand_name,
)
from e2e import images
from e2e.controlplane import ApiError, ControlPlane
from e2e.host_state import pod_pid
from e2e.images import DCGM_EXPORTER, DRA_PLUGIN, GFD, PLUGIN, PROBE
from e2e.node import Node
from e2e.node_dra import DRA_DRIVER, DRA_DRIVER_GROUP
from host import audit
from offline.render import render
from tests.real.conftest import eventually as real_eventually
from tests.real.conftest import linked
from tests.real.harness import denial
from tests.support.stacks import EXPOSED, HIDDEN, write_stack

NODE = "gpu-node-01"
TENANT = "ml-team"
PLUGIN_NAMESPACE = "hidden-gpu-system"
GPU = "nvidia.com/gpu"
RUNTIME_CLASS = f"hidden-gpu-{NODE}"
# What the node tier runs, by the names e2e.build links.
REQUIRED = (
    "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "containerd",
    "containerd-shim-runc-v2", "ctr", "runc", "nvidia-container-runtime", "pause", "probe", "hidden-gpu-test-plugin",
    "hidden-gpu-test-gfd", "hidden-gpu-test-dcgm-exporter", "hidden-gpu-test-dra-plugin",
)  # fmt: skip
GUARD_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# A pod starts in a few seconds here; a plugin roll and re-registration in about ten.
WAIT_S = 90.0


@pytest.fixture(scope="session")
def node_bin_dir() -> Path:
    if os.geteuid() != 0:
        pytest.fail("the node tier runs containerd and a kubelet: run it as root")
    return linked(REQUIRED)


@pytest.fixture(scope="session")
def node_plane(node_bin_dir: Path) -> Iterator[ControlPlane]:
    # The node lifecycle controller lifts the API server's not-ready taint once the kubelet reports Ready, as in
    # a cluster (tests/real has no kubelet and lifts it by hand); the resource claim controller releases a deleted
    # pod's claims and lets deleted claims go; the root CA publisher gives a pod with an API token (the pinned DRA
    # kubelet plugin's) the CA to trust the API server by.
    with ControlPlane.start(
        node_bin_dir,
        controllers=(
            "node-lifecycle-controller",
            "resourceclaim-controller",
            "root-ca-certificate-publisher-controller",
        ),
        identities={f"system:node:{NODE}": ["system:nodes"], DRA_DRIVER: [DRA_DRIVER_GROUP]},
    ) as plane:
        plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": TENANT}})
        yield plane


@pytest.fixture(scope="session")
def node(node_plane: ControlPlane, node_bin_dir: Path) -> Iterator[Node]:
    # The node's GPUs, as the synthetic CDI spec names them: the stack's exposed and hidden UUIDs.
    with Node.start(node_plane, node_bin_dir, NODE, [EXPOSED, *HIDDEN]) as started:
        print(f"node {NODE}: containerd and images {started.timings['containerd']:.1f} s, "
              f"Ready {started.timings['ready']:.1f} s")  # fmt: skip
        yield started


def stack(strategy: str) -> dict[str, Any]:
    """One node exposing EXPOSED and hiding HIDDEN; the plugin's device-list strategy as given."""
    plugin: dict[str, Any] = {"image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0", "deviceListStrategy": strategy}
    if strategy == "volume-mounts":
        plugin["volumeMountsAcceptedBy"] = "nodeConfig"  # the node's toolkit config accepts them (e2e.node.HARDENED)
    return {
        "kubernetes:context": "admin@e2e",
        "pulumi:disable-default-providers": ["kubernetes"],
        "hidden-gpu:nodes": [{"name": NODE, "exposedGpus": [EXPOSED], "hiddenGpus": list(HIDDEN)}],
        "hidden-gpu:devicePlugin": plugin,
    }


def rendered_objects(
    tmp: Path, strategy: str, *, guard: bool, config: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The render of stack(strategy) (or of `config`), as `make render` writes it; without the guard's policies
    unless asked.
    The one change: each DaemonSet's image is its stand-in's (e2e/go/node/cmd: the plugin's, GFD's and
    dcgm-exporter's; e2e/go/dra: the DRA kubelet plugin's), imported locally (pull policy Never), since NVIDIA's images cannot be had here. Every other
    field, security context, seccomp profile, mounts, env and runtime class included, is the render's."""
    rendered = render(write_stack(tmp, config or stack(strategy), name="node"))
    objects = []
    for name, obj in sorted(rendered.files.items()):
        if not guard and name.startswith("validatingadmissionpolicy"):
            continue
        annotations = obj.get("metadata", {}).get("annotations") or {}
        for key in [
            k for k in annotations if k.startswith(PROVIDER_ANNOTATION_PREFIX)
        ]:  # the provider's, not the object's
            del annotations[key]
        if obj["kind"] == "DaemonSet" and obj["metadata"]["name"] in STAND_INS:
            images.substitute(obj, STAND_INS[obj["metadata"]["name"]])
        objects.append(obj)
    # Namespaces first, as Pulumi's dependency order has them.
    return sorted(objects, key=lambda o: o["kind"] != "Namespace")


# THE image substitution, by DaemonSet (the pinned DRA plugin's network: tests/node/test_dra_claim.py).
STAND_INS = {
    dra_plugin_name(NODE): DRA_PLUGIN.name,
    device_plugin_name(NODE): PLUGIN.name,
    pinned_operand_name("gpu-feature-discovery", NODE): GFD.name,
    pinned_operand_name("dcgm-exporter", NODE): DCGM_EXPORTER.name,
}
SAMPLE_S = 0.1
Sample = tuple[float, int, list[str]]


class Sampler(threading.Thread):
    """The node's allocatable nvidia.com/gpu and the plugin pods (by image) running on the node, read from the API
    every 100 ms."""

    def __init__(self, plane: ControlPlane, images: tuple[str, ...] = (PLUGIN.name,)) -> None:
        super().__init__(daemon=True)
        self.plane, self.images = plane, images
        self.samples: list[Sample] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.stopping.wait(SAMPLE_S):
            try:
                node = self.plane.request("GET", f"/api/v1/nodes/{NODE}")
            except ApiError:  # the plane shutting down
                return
            gpus = int(node["status"].get("allocatable", {}).get(GPU, "0"))
            pods = self.plane.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}")["items"]
            running = [
                f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                for p in pods
                if any(c["image"].endswith(self.images) for c in p["spec"]["containers"])
                and any("running" in (s.get("state") or {}) for s in p.get("status", {}).get("containerStatuses", []))
            ]
            self.samples.append((round(time.monotonic() - started, 2), gpus, running))


def apply_render(plane: ControlPlane, objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        plane.apply(obj, manager="hidden-gpu")


def clear_plugin_namespace(plane: ControlPlane) -> None:
    """Every DaemonSet earlier modules left in the plugin's namespace (the plugin, the pinned operands) deleted, and
    their pods gone: the module starts from a node without them."""
    plane.request("DELETE", f"/apis/apps/v1/namespaces/{PLUGIN_NAMESPACE}/daemonsets")
    # Their pods deleted here too, not left to the garbage collector, whose pace is not this test's: one CI run
    # (2 cores, whole node tier) still had pods here 90 s later.
    delete_every_pod(plane, PLUGIN_NAMESPACE)


def delete_every_pod(plane: ControlPlane, namespace: str) -> None:
    """Delete every pod of the namespace, gracefully (the kubelet confirms), and wait until none is left."""
    plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods")
    eventually(lambda: no_pods(plane, namespace), f"no pod left in {namespace}")


def no_pods(plane: ControlPlane, namespace: str) -> bool:
    """True when the namespace has no pod; else an AssertionError naming each pod left, its phase, whether it is
    being deleted and its containers' states: a wait that times out says which pod the kubelet kept, and why."""
    pods = plane.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
    if pods:
        raise AssertionError(
            "; ".join(
                f"{p['metadata']['name']} {p.get('status', {}).get('phase')}"
                f" deleting={p['metadata'].get('deletionTimestamp')}"
                f" owner={[o['kind'] for o in p['metadata'].get('ownerReferences') or []]}"
                f" containers={[(s['name'], sorted(s.get('state') or {})) for s in p.get('status', {}).get('containerStatuses') or []]}"
                for p in pods
            )
        )
    return True


def delete_guard(plane: ControlPlane, *, missing_ok: bool = True) -> None:
    """Delete every admission policy and binding a stack's guard leaves (retained on delete, by design): the modules
    after one that ran `up` run routes without it. `missing_ok=False`: each must be there (a destroy retained it)."""
    for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
        for name in (POLICY_NAME, ENV_KEYS_POLICY_NAME, CLAIMS_POLICY_NAME, NODE_SWITCHES_POLICY_NAME):
            with contextlib.suppress(*((ApiError,) if missing_ok else ())):
                plane.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}")


def remove_guard(plane: ControlPlane, objects: list[dict[str, Any]]) -> None:
    """Delete the render's admission policies and bindings and wait until a denied pod is admitted again: the modules
    after the one that applied them run routes without the guard."""
    for obj in objects:
        if obj["kind"] in GUARD_KINDS:
            plane.request("DELETE", plane.path(obj))
    probe = probe_pod("zero-gpus", gpus=0)
    eventually(lambda: denial(plane, probe, namespace=TENANT, identity="admin") is None, "the guard gone")


def eventually(check: Callable[[], Any], what: str, seconds: float = WAIT_S) -> Any:
    return real_eventually(check, seconds, what)


def plugin_pod(plane: ControlPlane, strategy: str) -> dict[str, Any]:
    """The plugin DaemonSet's Running pod with DEVICE_LIST_STRATEGY = strategy (a roll ends with one)."""
    pods = plane.request(
        "GET", f"/api/v1/namespaces/{PLUGIN_NAMESPACE}/pods?labelSelector=app.kubernetes.io/instance%3D{NODE}"
    )["items"]
    for pod in pods:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
        if (
            env.get("DEVICE_LIST_STRATEGY") == strategy
            and pod["status"].get("phase") == "Running"
            and not pod["metadata"].get("deletionTimestamp")
        ):
            return dict(pod)
    return {}


def probe_pod(
    name: str,
    *,
    gpus: int | None = None,
    env: dict[str, str] | None = None,
    sleep: bool = False,
    node_name: str | None = None,
) -> dict[str, Any]:
    """A tenant pod of the node's RuntimeClass running the probe image (whose ENV says NVIDIA_VISIBLE_DEVICES=all)."""
    container: dict[str, Any] = {
        "name": "probe",
        "image": PROBE.name,
        "imagePullPolicy": "Never",
        "args": ["sleep" if sleep else "exit"],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    if gpus is not None:
        container["resources"] = {"limits": {GPU: str(gpus)}}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    spec: dict[str, Any] = {
        "runtimeClassName": RUNTIME_CLASS,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    if node_name:
        spec["nodeName"] = node_name  # past the scheduler: the kubelet's own admission decides
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": TENANT}, "spec": spec}


def run_probe(plane: ControlPlane, node: Node, pod: dict[str, Any]) -> dict[str, Any]:
    """Create the pod and wait until its probe has printed everything; returns the pod and what it saw."""
    created = plane.create(pod)
    namespace, name = created["metadata"]["namespace"], created["metadata"]["name"]

    def printed() -> dict[str, Any] | None:
        current = plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        phase = current["status"].get("phase")
        if phase == "Failed":
            return {"pod": current, "lines": []}
        lines = node.logs(namespace, name) if phase in ("Running", "Succeeded") else []
        return {"pod": current, "lines": lines} if "done" in lines else None

    result: dict[str, Any] = eventually(printed, f"pod {name} printed its view")
    return result


def seen(lines: list[str]) -> set[str]:
    """The GPUs a probe saw: the synthetic spec's markers (variables and files must agree)."""
    variables = {line.split(" ", 1)[1] for line in lines if line.startswith("cdi-env ")}
    files = {line.split(" ", 1)[1] for line in lines if line.startswith("cdi-file ")}
    assert variables == files, f"the CDI markers disagree: {lines}"
    return files


def delete_pods(plane: ControlPlane) -> None:
    """Delete every tenant pod and wait until the kubelet has stopped them."""
    delete_every_pod(plane, TENANT)


def allocated(node: Node, pod: dict[str, Any]) -> list[str]:
    """The device IDs the kubelet's checkpoint says it allocated to the pod's container."""
    ids: list[str] = []
    for entry in node.checkpoint().get("PodDeviceEntries") or []:
        if entry["PodUID"] == pod["metadata"]["uid"] and entry["ResourceName"] == GPU:
            device_ids = entry["DeviceIDs"]
            ids += [i for group in device_ids.values() for i in group] if isinstance(device_ids, dict) else device_ids
    return sorted(ids)


def alloc_response(node: Node, pod: dict[str, Any]) -> bytes:
    """The plugin's Allocate answer the kubelet checkpointed for the pod (a serialized protobuf)."""
    for entry in node.checkpoint().get("PodDeviceEntries") or []:
        if entry["PodUID"] == pod["metadata"]["uid"] and entry["ResourceName"] == GPU:
            return base64.b64decode(entry["AllocResp"])
    return b""


def run_audit(node: Node, tmp: Path, stack_file: Path, gpus: list[str], pids: dict[str, int]) -> tuple[int, str]:
    """host.audit on this node: the real kubelet's PodResources socket, its pod log directory and the pods' real
    cgroups. NVML is the stand-in: a host record of `gpus` (minor number = place), `pids[uuid]` a process on it."""
    record = tmp / "record.json"
    record.write_text(json.dumps([{"uuid": u, "processes": [{"pid": pids[u]}] if u in pids else []} for u in gpus]))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = audit.main(
            ["--stack-file", str(stack_file), "--node", NODE, "--record", str(record), *node.audit_sources(tmp)]
        )
    return status, out.getvalue()


def probe_pid(pod_uid: str) -> int:
    """The host PID of the sleeping probe in this pod."""
    return pod_pid(pod_uid, b"probe")
