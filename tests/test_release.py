"""cluster.release gives back only what hidden-gpu hid, only what no stack in that cluster still hides,
and only on --yes. The fast tier's API server models the apply that names no field; tests/real runs it
against the real API server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cluster import release
from common.cli import EXIT_FINDING, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from common.names import DEVICE_PLUGIN_LABEL, FIELD_MANAGER, NODE_LABEL, OPERAND_LABELS, STACK_LABEL
from desired.stack_claims import exposed_by_node, record_data
from stack_config import NodeConfig
from tests.support import fake_apiserver
from tests.support.fake_apiserver import Cluster, managed_fields, node, serve
from tests.support.stacks import EXPOSED, HIDDEN, valid_config, write_stack

GFD = OPERAND_LABELS["gpu_feature_discovery"]
DCGM = OPERAND_LABELS["dcgm_exporter"]
RETIRED = {DEVICE_PLUGIN_LABEL: "false", GFD: "false", DCGM: "true", "team": "ml", NODE_LABEL: "gpu-node-09"}
OURS = [DEVICE_PLUGIN_LABEL, GFD, NODE_LABEL]


def retired(managers: list[dict[str, Any]] | None = None, labels: dict[str, str] = RETIRED) -> dict[str, Any]:
    found = node("gpu-node-09", 8, dict(labels))
    found["metadata"]["managedFields"] = managers if managers is not None else [managed_fields(FIELD_MANAGER, OURS)]
    return found


def record(stack: str, node_name: str) -> dict[str, Any]:
    listed = NodeConfig.model_validate({"name": node_name, "exposedGpus": [EXPOSED], "hiddenGpus": [HIDDEN[0]]})
    name = f"hidden-gpu-stack-{stack}"
    return {
        "metadata": {"name": name, "namespace": "hidden-gpu-system", "labels": {STACK_LABEL: stack}},
        "data": record_data(stack, exposed_by_node([listed])),
    }


def give_back(
    tmp_path: Path, node_name: str, *extra: str, cluster: Cluster | None = None
) -> tuple[int, dict[str, str], list[tuple[str, str, str]]]:
    cluster = cluster or Cluster(nodes=[retired()])
    cluster.nodes.append(node("gpu-node-01", 1, {DEVICE_PLUGIN_LABEL: "false"}))
    with serve(tmp_path, cluster) as kubeconfig:
        args = ["--stack-file", str(write_stack(tmp_path, valid_config())), "--node", node_name]
        status = release.main([*args, "--kubeconfig", str(kubeconfig), "--context", "admin@test", *extra])
    return status, cluster.nodes[0]["metadata"]["labels"], cluster.requests


def test_without_yes_nothing_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, labels, requests = give_back(tmp_path, "gpu-node-09")
    assert status == EXIT_OK and labels == {**RETIRED, "kubernetes.io/hostname": "gpu-node-09"}
    assert {method for method, _, _ in requests} == {"GET"}
    assert f"would remove {NODE_LABEL}, {DEVICE_PLUGIN_LABEL}, {GFD} (dry run" in capsys.readouterr().out


def test_yes_gives_up_what_hidden_gpu_owns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, labels, requests = give_back(tmp_path, "gpu-node-09", "--yes")
    assert status == EXIT_OK
    assert labels == {DCGM: "true", "team": "ml", "kubernetes.io/hostname": "gpu-node-09"}
    [(method, path, content_type)] = [r for r in requests if r[0] != "GET"]
    assert (method, content_type) == ("PATCH", "application/apply-patch+yaml")
    assert f"fieldManager={FIELD_MANAGER}" in path
    out = capsys.readouterr().out
    assert f"removed {NODE_LABEL}, {DEVICE_PLUGIN_LABEL}, {GFD}" in out
    # No NFD label, no gpu.present: no GPU Operator labelled this node, so nothing is asked of it.
    assert "not a node the GPU Operator has labelled" in out


def test_a_switch_another_manager_also_set_stays_and_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    managers = [managed_fields(FIELD_MANAGER, OURS), managed_fields("kubectl-label", [GFD], "Update")]
    status, labels, _ = give_back(tmp_path, "gpu-node-09", "--yes", cluster=Cluster(nodes=[retired(managers)]))
    assert status == EXIT_FINDING and labels[GFD] == "false" and DEVICE_PLUGIN_LABEL not in labels
    assert f"{GFD} stays: also set by kubectl-label" in capsys.readouterr().out


def test_a_node_hidden_by_hand_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The recipe's `kubectl label ... device-plugin=false`, in no stack: not hidden-gpu's to give back."""
    by_hand = retired(
        [managed_fields("kubectl-label", [DEVICE_PLUGIN_LABEL], "Update")], {DEVICE_PLUGIN_LABEL: "false"}
    )
    status, labels, requests = give_back(tmp_path, "gpu-node-09", "--yes", cluster=Cluster(nodes=[by_hand]))
    assert status == EXIT_USAGE and labels[DEVICE_PLUGIN_LABEL] == "false"
    assert {method for method, _, _ in requests} == {"GET"}
    assert "not hidden by hidden-gpu" in capsys.readouterr().err


def test_a_node_another_stack_still_hides_in_this_cluster_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The file handed over does not list the node, but prod's record in the cluster talked to does."""
    cluster = Cluster(nodes=[retired()], config_maps=[record("prod", "gpu-node-09")])
    status, labels, requests = give_back(tmp_path, "gpu-node-09", "--yes", cluster=cluster)
    assert status == EXIT_USAGE and labels[DEVICE_PLUGIN_LABEL] == "false"
    assert {method for method, _, _ in requests} == {"GET"}
    assert "stack prod still hides it in this cluster (ConfigMap hidden-gpu-system/hidden-gpu-stack-prod)" in (
        capsys.readouterr().err
    )


def test_an_unreadable_record_claims_every_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = record("prod", "gpu-node-01") | {"data": {"stack.json": "{}"}}
    status, _, _ = give_back(tmp_path, "gpu-node-09", "--yes", cluster=Cluster(nodes=[retired()], config_maps=[broken]))
    assert status == EXIT_USAGE and "still hides it" in capsys.readouterr().err


def test_a_node_still_in_the_stack_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _labels, requests = give_back(tmp_path, "gpu-node-01", "--yes")
    assert status == EXIT_USAGE and requests == []
    assert "still in" in capsys.readouterr().err


def test_an_unknown_node_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, _ = give_back(tmp_path, "gpu-node-77", "--yes")
    assert status == EXIT_USAGE
    assert capsys.readouterr().err == "error: --node gpu-node-77: no such node in the cluster\n"


# A release whose answer is lost: the node is read again, and the command says which state it is in.
@pytest.mark.parametrize(
    "case",
    [
        ("applied, dropped", EXIT_OK, True, "the node read again shows it released"),
        ("dropped", EXIT_UNAVAILABLE, False, "still hidden: the release was sent and not answered"),
        ("dropped, broken", EXIT_UNAVAILABLE, False, "state unknown: the release was sent and not answered"),
    ],
    ids=["applied", "not-applied", "unreadable"],
)
def test_an_unanswered_release_says_what_state_the_node_is_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: tuple[str, int, bool, str]
) -> None:
    fault, status, released, said = case
    cluster = Cluster(nodes=[retired()], patch_faults=[fault])
    got, labels, requests = give_back(tmp_path, "gpu-node-09", "--yes", "--deadline", "20", cluster=cluster)
    out, err = capsys.readouterr()
    assert got == status, (out, err)
    assert (DEVICE_PLUGIN_LABEL not in labels) is released
    assert [m for m, _, _ in requests].count("PATCH") == 1  # never sent twice: the new read decides
    assert said in out + err and len(err.splitlines()) == (0 if released else 1)
    if released:
        assert f"removed {NODE_LABEL}, {DEVICE_PLUGIN_LABEL}, {GFD}" in out
    else:
        assert "run this command again" in err
    if fault == "dropped, broken":
        assert f"`kubectl get node gpu-node-09 --show-labels` ({DEVICE_PLUGIN_LABEL}=false: still hidden)" in err


@pytest.mark.slow  # waits out most of its deadline (4 s): make test-all
def test_a_release_answered_too_late_is_read_again_within_the_deadline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server applies the release and says nothing: the write's wait ends early enough that the new
    read fits in the deadline."""
    # The server stays silent far longer than the deadline: a release that waited for it could not pass. A deadline
    # of 6 s keeps the re-read (a third of what is left after the write) clear of a slow first request.
    monkeypatch.setattr(fake_apiserver, "SILENT_SECONDS", 60.0)
    cluster = Cluster(nodes=[retired()], patch_faults=["applied, silent"])
    started = time.monotonic()
    got, labels, _ = give_back(tmp_path, "gpu-node-09", "--yes", "--deadline", "6", cluster=cluster)
    assert time.monotonic() - started < 30
    out = capsys.readouterr().out
    assert got == EXIT_OK and DEVICE_PLUGIN_LABEL not in labels
    assert "did not finish answering PATCH /api/v1/nodes/gpu-node-09 before the deadline" in out
    assert "the node read again shows it released" in out
