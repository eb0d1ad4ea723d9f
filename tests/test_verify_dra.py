"""cluster.verify on prod with DRA allocating its GPUs, against an API server on loopback. The pinned kubelet
plugin's ResourceSlices list the exposed GPUs alone and no DeviceClass a tenant may use selects a hidden GPU; NVIDIA's
own kubelet plugin, a hidden GPU in a slice, a class mapping nvidia.com/gpu or one whose selector cannot be evaluated
are named. Two allocators of one GPU are named too: a tenant class reaching a device plugin's GPU, a DRA node still
advertising nvidia.com/gpu, and pods still holding a plugin's GPU on a node switched to DRA."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from common.cli import EXIT_FINDING, EXIT_OK
from common.tokens import Token
from offline.program import run_program
from stack_config import parse_project_config
from tests.support.fake_apiserver import Cluster, pod
from tests.support.stacks import dra_allocated, write_stack
from tests.support.verify_cluster import PROD_CONFIG, healthy, mismatches, run

DRA_CONFIG = {
    **dra_allocated(PROD_CONFIG),
    "hidden-gpu:guard": {**PROD_CONFIG.get("hidden-gpu:guard", {}), "allowedDeviceClasses": ["nic.example.com"]},
}


def dra_cluster(*, stock: bool = False) -> Cluster:
    """prod with DRA allocating its GPUs, as `up` leaves it: gpu-node-01's slice as the pinned kubelet plugin publishes
    it (the exposed GPUs), or, `stock`, as NVIDIA's own (its chart's DaemonSet, privileged) does: every GPU."""
    cluster = healthy(DRA_CONFIG, stack="prod")
    for resource in run_program(DRA_CONFIG, "prod").of_type(Token.DEVICE_CLASS):
        cluster.device_classes.append(copy.deepcopy(resource.inputs))
    first = parse_project_config(DRA_CONFIG).nodes[0]
    devices = [
        {"name": f"gpu-{minor}", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}}}
        for minor, uuid in enumerate([*first.exposed_gpus, *(first.hidden_gpus if stock else [])])
    ]
    cluster.resource_slices.append(
        {"metadata": {"name": "s"}, "spec": {"driver": "gpu.nvidia.com", "nodeName": first.name, "devices": devices}}
    )
    if stock:
        theirs = pod("nvidia-dra-driver-gpu-kubelet-plugin-x1", "nvidia-dra-driver-gpu", first.name, {})
        theirs["spec"]["containers"][0]["image"] = "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1"
        theirs["metadata"]["ownerReferences"] = [
            {"kind": "DaemonSet", "name": "nvidia-dra-driver-gpu-kubelet-plugin", "controller": True}
        ]
        cluster.pods.append(theirs)
    return cluster


def device_class(name: str, expression: str | None = None, extended: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]} if expression else {}
    return {"metadata": {"name": name}, "spec": spec | ({"extendedResourceName": extended} if extended else {})}


def test_dra_stack_healthy_with_the_drivers_slice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The pinned kubelet plugin Ready on each DRA node, its slice listing the exposed GPUs alone; no class tenants may
    use selects a hidden GPU: the stack's own select exposed UUIDs only, the allowed NIC class another driver's."""
    cluster = dra_cluster()
    cluster.device_classes.append(device_class("nic.example.com", "device.driver == 'nic.example.com'"))
    status, out, _ = run(tmp_path, cluster, capsys, stack=str(write_stack(tmp_path, DRA_CONFIG, "prod")))
    assert status == EXIT_OK, out
    assert "DeviceClass hidden-gpu-pool-shared" in out and "ResourceQuota hidden-gpu-pool-shared." in out
    assert "pinned DRA kubelet plugin pods Ready" in out and "hidden GPUs in its ResourceSlices" in out


def test_dra_findings_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """NVIDIA's own kubelet plugin on the node, and the hidden GPU its slice lists (issue 41); NVIDIA's class mapping
    nvidia.com/gpu; an allowed class that selects every device (the hidden GPU among them); one whose selector cannot
    be evaluated here (fail closed); the stack's own class gone."""
    cluster = dra_cluster(stock=True)
    cluster.device_classes.append(device_class("gpu.nvidia.com", "device.driver == 'gpu.nvidia.com'", "nvidia.com/gpu"))
    cluster.device_classes.append(device_class("nic.example.com", "quantity('1') == quantity('1')"))
    cluster.device_classes = [c for c in cluster.device_classes if c["metadata"]["name"] != "hidden-gpu-pool-shared"]
    config = {**DRA_CONFIG, "hidden-gpu:guard": {"allowedDeviceClasses": ["nic.example.com"]}}
    status, out, _ = run(tmp_path, cluster, capsys, stack=str(write_stack(tmp_path, config, "prod")))
    assert status == EXIT_FINDING
    text = "\n".join(line for line in out.splitlines() if line.endswith("MISMATCH"))
    assert "gpu.nvidia.com->nvidia.com/gpu" in text
    assert "DeviceClass hidden-gpu-pool-shared" in text and "<missing>" in text
    hidden = parse_project_config(config).nodes[0].hidden_gpus
    assert f"{hidden[0]} by nic.example.com (selector not evaluable here)" in text
    rows = [" ".join(row) for row in mismatches(out)]
    (listed,) = [row for row in rows if row.startswith("gpu-node-01 hidden GPUs in its ResourceSlices none ")]
    assert all(f"{uuid} in ResourceSlice s" in listed for uuid in hidden), listed
    assert (
        "gpu-node-01 NVIDIA's own DRA kubelet plugin pods 0 1 "
        "(nvidia-dra-driver-gpu/DaemonSet nvidia-dra-driver-gpu-kubelet-plugin) MISMATCH"
    ) in rows


def test_a_plugin_gpu_a_tenant_class_selects_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 40, 2: on a plugin node, an allowed class that selects every device of NVIDIA's driver reaches the
    exposed GPU the plugin also hands out: two allocators of one GPU. And a DRA node advertising nvidia.com/gpu (a
    plugin left running there) is a mismatch of its allocatable count."""
    config = {**PROD_CONFIG, "hidden-gpu:guard": {"allowedDeviceClasses": ["nic.example.com"]}}
    cluster = healthy(config)
    cluster.device_classes.append(device_class("nic.example.com", "device.driver == 'gpu.nvidia.com'"))
    first = parse_project_config(config).nodes[0]
    devices = [
        {"name": f"gpu-{minor}", "attributes": {"uuid": {"string": uuid}}}
        for minor, uuid in enumerate([*first.exposed_gpus, *first.hidden_gpus])
    ]
    cluster.resource_slices.append(
        {"metadata": {"name": "s"}, "spec": {"driver": "gpu.nvidia.com", "nodeName": first.name, "devices": devices}}
    )
    status, out, _ = run(tmp_path, cluster, capsys, stack=str(write_stack(tmp_path, config, "prod")))
    assert status == EXIT_FINDING
    (row,) = [line for line in out.splitlines() if "GPUs of its device plugin a tenant DeviceClass selects" in line]
    assert row.endswith("MISMATCH") and all(f"{uuid} by nic.example.com" in row for uuid in first.exposed_gpus), row

    dra = dra_cluster()
    (node_01,) = [n for n in dra.nodes if n["metadata"]["name"] == first.name]
    node_01["status"]["allocatable"] = {"nvidia.com/gpu": "2"}
    status, out, _ = run(tmp_path, dra, capsys, stack=str(write_stack(tmp_path, DRA_CONFIG, "prod")))
    assert status == EXIT_FINDING
    assert [row[:5] for row in mismatches(out)] == [[first.name, "allocatable", "nvidia.com/gpu", "0", "2"]], out


def test_a_pod_holding_a_plugins_gpu_on_a_dra_node_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A node switched to allocator dra keeps the GPUs its plugin gave out, in running pods the kubelet still holds
    them for, while the DRA allocator sees them free: verify names each such pod (drain them first)."""
    cluster = dra_cluster()
    gpu_pod = {"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    cluster.namespaces = [{"metadata": {"name": "ml-team"}}]
    cluster.pods += [
        {
            "metadata": {"name": "trainer", "namespace": "ml-team"},
            "spec": {"nodeName": "gpu-node-01", "containers": [gpu_pod]},
        },
        {
            "metadata": {"name": "cpu", "namespace": "ml-team"},
            "spec": {"nodeName": "gpu-node-01", "containers": [{"name": "b", "image": "x"}]},
        },
    ]
    status, out, _ = run(tmp_path, cluster, capsys, stack=str(write_stack(tmp_path, DRA_CONFIG, "prod")))
    assert status == EXIT_FINDING
    assert [" ".join(row) for row in mismatches(out)] == [
        "gpu-node-01 pods holding a device plugin's GPU (allocator dra: drain them) none ml-team/trainer MISMATCH"
    ], out
