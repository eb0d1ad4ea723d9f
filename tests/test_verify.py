"""cluster.verify through the real kubernetes client against an API server on loopback."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster import verify
from common.names import DEFAULT_PLUGIN_NAMESPACE
from stack_config import load_stack_file
from tests.support.fake_apiserver import kubeconfig_for, node, pod, serve

PROD = Path(__file__).resolve().parent.parent / "stacks" / "Pulumi.prod.yaml"
OFF = {"nvidia.com/gpu.deploy.device-plugin": "false"}
PINNED = {"app.kubernetes.io/part-of": "hidden-gpu", "app.kubernetes.io/instance": "gpu-node-01"}
OPERATOR = {"app": "nvidia-device-plugin-daemonset"}


def healthy() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """prod as it should look: gpu-node-01 offers its 2 exposed GPUs, gpu-node-02 none."""
    nodes = [node("gpu-node-01", 2, OFF), node("gpu-node-02", None, OFF), node("cpu-node-01", None, {})]
    pods = [
        pod("nvidia-device-plugin-gpu-node-01-x7k2p", DEFAULT_PLUGIN_NAMESPACE, "gpu-node-01", PINNED),
        pod("nvidia-device-plugin-daemonset-abcde", "gpu-operator", "gpu-node-03", OPERATOR),
    ]
    return nodes, pods


def run(
    tmp_path: Path, nodes: list[dict[str, Any]], pods: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    with serve(tmp_path, nodes, pods) as kubeconfig:
        status = verify.main(["--stack", "prod", "--kubeconfig", str(kubeconfig), "--context", "admin@test"])
    return status, capsys.readouterr().out


def test_prod_fixture_matches_the_stack() -> None:
    stack = load_stack_file(PROD)
    assert [(n.name, len(n.exposed_gpus)) for n in stack.nodes] == [("gpu-node-01", 2), ("gpu-node-02", 0)]


def test_healthy_cluster_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = run(tmp_path, *healthy(), capsys)
    assert status == 0, out
    assert "MISMATCH" not in out
    assert out.strip().endswith("result: 0 mismatch(es) in 10 checks")


def test_operator_plugin_still_advertising_every_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = healthy()
    nodes[0] = node("gpu-node-01", 8, {"nvidia.com/gpu.deploy.device-plugin": "true"})
    pods.append(pod("nvidia-device-plugin-daemonset-zzzzz", "gpu-operator", "gpu-node-01", OPERATOR))
    status, out = run(tmp_path, nodes, pods, capsys)
    assert status == 1
    mismatches = [line.split() for line in out.splitlines() if line.endswith("MISMATCH")]
    assert ["gpu-node-01", "capacity", "nvidia.com/gpu", "2", "8", "MISMATCH"] in mismatches
    assert ["gpu-node-01", "allocatable", "nvidia.com/gpu", "2", "8", "MISMATCH"] in mismatches
    assert ["gpu-node-01", "label", "nvidia.com/gpu.deploy.device-plugin", "false", "true", "MISMATCH"] in mismatches
    assert ["gpu-node-01", "GPU", "Operator", "device-plugin", "pods", "0", "1", "MISMATCH"] in mismatches
    assert out.strip().endswith("result: 4 mismatch(es) in 10 checks")


def test_pinned_plugin_not_ready_and_hidden_node_advertising(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = healthy()
    pods[0] = pod(
        "nvidia-device-plugin-gpu-node-01-x7k2p", DEFAULT_PLUGIN_NAMESPACE, "gpu-node-01", PINNED, ready=False
    )
    nodes[1] = node("gpu-node-02", 8, OFF)
    status, out = run(tmp_path, nodes, pods, capsys)
    assert status == 1
    assert any(
        line.split()[:6] == ["gpu-node-01", "pinned", "plugin", "pods", "Ready", "1"] and line.endswith("MISMATCH")
        for line in out.splitlines()
    )
    assert any(
        line.split() == ["gpu-node-02", "allocatable", "nvidia.com/gpu", "0", "8", "MISMATCH"]
        for line in out.splitlines()
    )


def test_node_missing_from_the_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = healthy()
    status, out = run(tmp_path, [n for n in nodes if n["metadata"]["name"] != "gpu-node-02"], pods, capsys)
    assert status == 1
    assert ["gpu-node-02", "node", "exists", "yes", "no", "MISMATCH"] in [line.split() for line in out.splitlines()]


def test_unreachable_api_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kubeconfig_for(f"http://127.0.0.1:{port}"))
    assert verify.main(["--stack", "prod", "--kubeconfig", str(kubeconfig)]) == 3
    assert capsys.readouterr().err.startswith("error: cannot reach the API server")


def test_unknown_context(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kubeconfig_for("http://127.0.0.1:1"))
    assert verify.main(["--stack", "prod", "--kubeconfig", str(kubeconfig), "--context", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nope" in err and err.count("\n") == 1


def test_time_sliced_node_expects_exposed_times_replicas(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stack = yaml.safe_load(PROD.read_text())
    stack["config"]["hidden-gpu:nodes"][0]["timeSlicing"] = {"replicas": 4}
    stack_file = tmp_path / "Pulumi.sliced.yaml"
    stack_file.write_text(yaml.safe_dump(stack))
    nodes, pods = healthy()
    nodes[0] = node("gpu-node-01", 8, OFF)  # 2 exposed GPUs, each advertised 4 times
    with serve(tmp_path, nodes, pods) as kubeconfig:
        assert verify.main(["--stack-file", str(stack_file), "--kubeconfig", str(kubeconfig)]) == 0
    assert "MISMATCH" not in capsys.readouterr().out
