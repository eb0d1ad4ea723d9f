"""hidden-gpu's pinned GFD and dcgm-exporter on a real kubelet, containerd and NVIDIA's runtime (stand-ins for
NVIDIA's programs: e2e/go/node/cmd/hidden-gpu-test-gfd and -dcgm-exporter, each reading the GPUs its container was
given, as NVML does): the node's labels count and name only the exposed GPU, the exporter's series carry only its
UUID, with the pod the kubelet allocated it to; the same DaemonSet given `all`, as the operator's reads, counts
every GPU, so the pinning is what keeps the hidden ones out."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.names import NFD_FEATURES_DIR, pinned_operand_name
from e2e.controlplane import ControlPlane
from e2e.host_state import pod_pid
from e2e.node import Node
from e2e.node_gpus import Toolkit
from tests.node.conftest import (
    NODE,
    PLUGIN_NAMESPACE,
    TENANT,
    apply_render,
    delete_pods,
    eventually,
    plugin_pod,
    probe_pod,
    rendered_objects,
    run_probe,
    stack,
)
from tests.support.stacks import EXPOSED, HIDDEN

FEATURES = Path(NFD_FEATURES_DIR) / "gfd"
GFD, EXPORTER = "gpu-feature-discovery", "dcgm-exporter"
# Inside the exporter's pod network namespace: the tier's CNI stub leaves its loopback down (e2e/node.py), which a
# cluster's loopback plugin brings up; then one scrape, as Prometheus makes it.
SCRAPE = """
import fcntl, socket, struct, sys, urllib.request
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH", fcntl.ioctl(sock, 0x8913, struct.pack("16sH", b"lo", 0)))[1]  # SIOCGIFFLAGS
fcntl.ioctl(sock, 0x8914, struct.pack("16sH", b"lo", flags | 1))  # SIOCSIFFLAGS: IFF_UP
sys.stdout.write(urllib.request.urlopen("http://127.0.0.1:9400/metrics", timeout=10).read().decode())
"""


def running(plane: ControlPlane, operand: str) -> dict[str, Any]:
    """The operand's Running pod on the node, none while one is going."""
    selector = f"app.kubernetes.io/name%3D{operand},app.kubernetes.io/instance%3D{NODE}"
    pods = plane.request("GET", f"/api/v1/namespaces/{PLUGIN_NAMESPACE}/pods?labelSelector={selector}")["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    ready = [p for p in live if p["status"].get("phase") == "Running"]
    return dict(ready[0]) if len(live) == 1 and ready else {}


def features() -> dict[str, str]:
    """The labels GFD wrote for NFD's worker, as it publishes them."""
    if not FEATURES.exists():
        return {}
    return dict(line.split("=", 1) for line in FEATURES.read_text().splitlines() if "=" in line)


def scrape(pod: dict[str, Any]) -> str:
    pid = pod_pid(pod["metadata"]["uid"], b"/hidden-gpu-test-dcgm-exporter")
    command = ["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", SCRAPE]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=30).stdout


def series(text: str, name: str) -> list[dict[str, str]]:
    """Each series of the metric, as its labels."""
    found = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            body = line[len(name) + 1 : line.rindex("}")]
            found.append({k: v.strip('"') for k, v in (pair.split("=", 1) for pair in body.split(","))})
    return found


@pytest.fixture(scope="module")
def deployed(node_plane: ControlPlane, node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    made = next(p for p in [FEATURES, *FEATURES.parents] if p.parent.exists())  # what the kubelet will create
    node.toolkit(Toolkit())
    config = stack("envvar")
    config["hidden-gpu:nodes"][0]["operands"] = {"gpuFeatureDiscovery": "pinned"}  # dcgm-exporter: the default
    objects = rendered_objects(tmp_path_factory.mktemp("render"), "envvar", guard=False, config=config)
    apply_render(node_plane, objects)
    eventually(lambda: plugin_pod(node_plane, "envvar"), "the plugin pod Running")
    eventually(lambda: running(node_plane, GFD) and features(), "GFD Running and its labels written")
    eventually(lambda: running(node_plane, EXPORTER), "dcgm-exporter Running")
    yield objects
    delete_pods(node_plane)
    for operand in (GFD, EXPORTER):
        path = f"/apis/apps/v1/namespaces/{PLUGIN_NAMESPACE}/daemonsets/{pinned_operand_name(operand, NODE)}"
        node_plane.request("DELETE", path)
    eventually(lambda: not running(node_plane, GFD) and not running(node_plane, EXPORTER), "the operands gone")
    subprocess.run(["rm", "-rf", str(made)], check=True)


def test_gfds_labels_count_only_the_exposed_gpu(node_plane: ControlPlane, deployed: list[Any]) -> None:
    labels = features()
    assert labels["nvidia.com/gpu.count"] == "1"  # of the node's three GPUs
    assert {"nvidia.com/gpu.product", "nvidia.com/gpu.memory"} <= labels.keys()
    assert not any(uuid in FEATURES.read_text() for uuid in (EXPOSED, *HIDDEN))  # GFD names no UUID at all
    pod = running(node_plane, GFD)
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"]["privileged"] is False
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": EXPOSED} in container["env"]


def test_exporter_series_carry_only_the_exposed_uuid_and_the_pod_given_it(
    node_plane: ControlPlane, node: Node, deployed: list[Any]
) -> None:
    tenant = run_probe(node_plane, node, probe_pod("metered", gpus=1, sleep=True))["pod"]
    text = scrape(running(node_plane, EXPORTER))
    temperatures = series(text, "DCGM_FI_DEV_GPU_TEMP")
    assert [s["UUID"] for s in temperatures] == [EXPOSED]
    assert not any(uuid in text for uuid in HIDDEN)
    # The kubelet's PodResources, read through the render's read-only mount, name the pod using the GPU.
    (only,) = temperatures
    assert (only["namespace"], only["pod"], only["Hostname"]) == (TENANT, tenant["metadata"]["name"], NODE)


def test_the_same_daemonset_given_every_gpu_counts_the_hidden_ones(
    node_plane: ControlPlane, deployed: list[Any]
) -> None:
    """The control: GFD's DaemonSet as the operator renders it, NVIDIA_VISIBLE_DEVICES left at the image's `all`,
    labels all three GPUs: the env the render sets is what keeps the count at one."""
    (daemon_set,) = [o for o in deployed if o["kind"] == "DaemonSet" and o["metadata"]["name"].startswith(GFD)]
    unpinned = json.loads(json.dumps(daemon_set))
    (container,) = unpinned["spec"]["template"]["spec"]["containers"]
    container["env"] = [e for e in container["env"] if e["name"] != "NVIDIA_VISIBLE_DEVICES"]
    apply_render(node_plane, [unpinned])
    eventually(lambda: features().get("nvidia.com/gpu.count") == "3", "the unpinned GFD's labels")
    apply_render(node_plane, [daemon_set])
    eventually(lambda: features().get("nvidia.com/gpu.count") == "1", "the pinned GFD's labels again")
