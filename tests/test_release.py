"""cluster.release: giving a node back is deliberate, removes only our switches, and only on --yes."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import release
from common.cli import EXIT_OK, EXIT_USAGE
from common.names import DEVICE_PLUGIN_LABEL, NODE_LABEL, OPERAND_LABELS
from tests.support.fake_apiserver import Cluster, node, serve
from tests.support.stacks import valid_config, write_stack

GFD = OPERAND_LABELS["gpu_feature_discovery"]
DCGM = OPERAND_LABELS["dcgm_exporter"]
RETIRED = {DEVICE_PLUGIN_LABEL: "false", GFD: "false", DCGM: "true", "team": "ml", NODE_LABEL: "gpu-node-09"}


def give_back(tmp_path: Path, node_name: str, *extra: str) -> tuple[int, dict[str, str], list[tuple[str, str, str]]]:
    cluster = Cluster(
        nodes=[node("gpu-node-09", 8, dict(RETIRED)), node("gpu-node-01", 1, {DEVICE_PLUGIN_LABEL: "false"})]
    )
    with serve(tmp_path, cluster) as kubeconfig:
        args = ["--stack-file", str(write_stack(tmp_path, valid_config())), "--node", node_name]
        status = release.main([*args, "--kubeconfig", str(kubeconfig), "--context", "admin@test", *extra])
    return status, cluster.nodes[0]["metadata"]["labels"], cluster.requests


def test_without_yes_nothing_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, labels, requests = give_back(tmp_path, "gpu-node-09")
    assert status == EXIT_OK and labels == {**RETIRED, "kubernetes.io/hostname": "gpu-node-09"}
    assert [method for method, _, _ in requests] == ["GET"]
    assert f"would remove {DEVICE_PLUGIN_LABEL}, {GFD}, {NODE_LABEL} (dry run" in capsys.readouterr().out


def test_yes_removes_only_our_switches_that_say_false(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, labels, requests = give_back(tmp_path, "gpu-node-09", "--yes")
    assert status == EXIT_OK
    assert labels == {DCGM: "true", "team": "ml", "kubernetes.io/hostname": "gpu-node-09"}
    assert requests[-1][0] == "PATCH" and requests[-1][2] == "application/merge-patch+json"
    assert f"removed {DEVICE_PLUGIN_LABEL}, {GFD}, {NODE_LABEL}" in capsys.readouterr().out


def test_a_node_still_in_the_stack_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _labels, requests = give_back(tmp_path, "gpu-node-01", "--yes")
    assert status == EXIT_USAGE and requests == []
    assert "still in" in capsys.readouterr().err


def test_an_unknown_node_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, _ = give_back(tmp_path, "gpu-node-77", "--yes")
    assert status == EXIT_USAGE
    assert capsys.readouterr().err == "error: --node gpu-node-77: no such node in the cluster\n"
