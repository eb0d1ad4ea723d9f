"""cluster.verify --textfile: the last run of a stack as Prometheus metrics, whatever its end, and alerting rules
that name only metrics it writes (as tests/test_audit.py checks the audit's)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cluster import verify
from cluster.metrics import METRICS
from common.cli import EXIT_FINDING, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from tests.support.fake_apiserver import Cluster, serve
from tests.support.verify_cluster import PROD_CONFIG, healthy, run
from tests.test_audit import promql_metric_names

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "cluster" / "hidden-gpu-verify.rules.yml"


def samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(path.read_text())
        for s in family.samples
    }


def one(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    (value,) = [v for (n, _), v in found.items() if n == name]
    return value


def verify_into(tmp_path: Path, cluster: Cluster, textfile: Path) -> int:
    with serve(tmp_path, cluster) as kubeconfig:
        return verify.main(
            ["--stack", "prod", "--kubeconfig", str(kubeconfig), "--context", "admin@test", "--textfile", str(textfile)]
        )


def test_a_clean_run_then_a_mismatch_then_a_server_that_cannot_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    textfile = tmp_path / "hidden_gpu_verify_prod.prom"
    assert verify_into(tmp_path, healthy(PROD_CONFIG), textfile) == EXIT_OK
    clean = samples(textfile)
    assert {n for n, _ in clean} == set(METRICS)  # what the rules test reads is what a run writes
    assert one(clean, "hidden_gpu_verify_exit_status") == EXIT_OK and one(clean, "hidden_gpu_verify_checked") == 1
    assert one(clean, "hidden_gpu_verify_mismatches") == 0
    success = one(clean, "hidden_gpu_verify_last_success_timestamp_seconds")
    assert success == one(clean, "hidden_gpu_verify_last_run_timestamp_seconds") > 0
    per_check = {labels: v for (n, labels), v in clean.items() if n == "hidden_gpu_verify_check_ok"}
    assert per_check and set(per_check.values()) == {1.0}
    assert all(dict(labels)["stack"] == "prod" for labels in per_check)
    # No value of a check in a label: they hold GPU UUIDs.
    assert "GPU-" not in textfile.read_text()

    broken = healthy(PROD_CONFIG)
    broken.nodes[0]["status"]["capacity"] = broken.nodes[0]["status"]["allocatable"] = {"nvidia.com/gpu": "8"}
    assert verify_into(tmp_path, broken, textfile) == EXIT_FINDING
    found = samples(textfile)
    assert one(found, "hidden_gpu_verify_mismatches") == 2 and one(found, "hidden_gpu_verify_exit_status") == 1
    failed = [dict(labels) for (n, labels), v in found.items() if n == "hidden_gpu_verify_check_ok" and v == 0]
    assert failed == [
        {"stack": "prod", "scope": "gpu-node-01", "check": f"{kind} nvidia.com/gpu"}
        for kind in ("capacity", "allocatable")
    ]
    assert one(found, "hidden_gpu_verify_last_success_timestamp_seconds") == success  # kept from the clean run

    down = Cluster(faults=["malformed"])
    assert verify_into(tmp_path, down, textfile) == EXIT_UNAVAILABLE
    gone = samples(textfile)
    assert one(gone, "hidden_gpu_verify_checked") == 0 and one(gone, "hidden_gpu_verify_exit_status") == 3
    assert not any(n in ("hidden_gpu_verify_check_ok", "hidden_gpu_verify_mismatches") for n, _ in gone)
    assert one(gone, "hidden_gpu_verify_last_success_timestamp_seconds") == success
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(textfile.name + ".")]  # no temporary left
    capsys.readouterr()


def test_a_missing_directory_is_refused_before_the_cluster_is_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = healthy(PROD_CONFIG)
    assert verify_into(tmp_path, cluster, tmp_path / "absent" / "m.prom") == EXIT_USAGE
    assert cluster.requests == []
    err = capsys.readouterr().err
    assert err == f"error: --textfile {tmp_path}/absent/m.prom: no directory {tmp_path}/absent; create it first\n"


def test_a_file_that_is_not_metrics_is_never_a_success(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    textfile = tmp_path / "m.prom"
    textfile.write_bytes(b"\xff\x00 not the exposition format {{{\n")
    assert verify_into(tmp_path, Cluster(faults=["malformed"]), textfile) == EXIT_UNAVAILABLE
    assert one(samples(textfile), "hidden_gpu_verify_last_success_timestamp_seconds") == 0
    capsys.readouterr()


def test_the_shipped_rules_name_metrics_verify_writes() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}
    assert set(alerts) == {
        "HiddenGpuVerifyMismatch",
        "HiddenGpuVerifyCannotCheck",
        "HiddenGpuVerifyStale",
        "HiddenGpuVerifyAbsent",
    }
    for alert, expression in alerts.items():
        names = promql_metric_names(expression)
        assert names and names <= set(METRICS), (alert, names - set(METRICS))


def test_the_rules_as_a_prometheus_rule_object(capsys: pytest.CaptureFixture[str]) -> None:
    """issue 42, 5: the shipped rules also as the Prometheus Operator's object, every group of both files, valid as
    the operator's CRD would take it (groups of named rules)."""
    from offline import prometheus_rule  # noqa: PLC0415

    assert prometheus_rule.main(["--namespace", "obs", "--label", "release=prometheus"]) == 0
    obj = yaml.safe_load(capsys.readouterr().out)
    assert (obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"]) == (
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        "obs",
    )
    assert obj["metadata"]["labels"]["release"] == "prometheus"
    names = {rule["alert"] for group in obj["spec"]["groups"] for rule in group["rules"]}
    assert {
        "HiddenGpuAuditViolation",
        "HiddenGpuAuditAbsent",
        "HiddenGpuVerifyMismatch",
        "HiddenGpuVerifyAbsent",
    } <= names
    assert all(
        set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
        for g in obj["spec"]["groups"]
        for rule in g["rules"]
    )
    assert prometheus_rule.main(["--label", "novalue"]) == 2


def test_the_verify_units_run_the_stack_they_are_named_for() -> None:
    """issue 42, 5: the audit unit was hard-coded to prod; the audit and verify units are templates of the stack."""
    audit = (ROOT / "host" / "hidden-gpu-audit@.service").read_text()
    verify_unit = (ROOT / "cluster" / "hidden-gpu-verify@.service").read_text()
    timer = (ROOT / "cluster" / "hidden-gpu-verify@.timer").read_text()
    assert "Pulumi.%i.yaml" in audit and "prod" not in audit.split("[Unit]", 1)[1]
    assert "-m cluster.verify --stack %i --textfile" in verify_unit and "hidden_gpu_verify_%i.prom" in verify_unit
    assert "OnUnitActiveSec=1h" in timer


def test_the_shipped_read_only_role_grants_every_read_of_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 42, 5: the docs require a read-only kubeconfig for previews and drift checks, and none shipped. Every
    collection verify read against the fake API server (the adopted DaemonSet too) is granted by the example role."""
    role = yaml.safe_load((ROOT / "examples" / "read-only-clusterrole.yaml").read_text())
    granted = {
        (group, resource) for rule in role["rules"] if {"get", "list"} <= set(rule["verbs"])
        for group in rule["apiGroups"] for resource in rule["resources"]
    }  # fmt: skip
    cluster = healthy(copy.deepcopy(PROD_CONFIG))
    assert run(tmp_path, cluster, capsys)[0] == EXIT_OK
    read = set()
    for _, path, _ in cluster.requests:
        parts = path.split("?")[0].strip("/").split("/")
        group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
        if rest[:1] == ["namespaces"] and len(rest) > 2:
            rest = rest[2:]
        read.add((group, rest[0]))
    assert read and read <= granted, read - granted
