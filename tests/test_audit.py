"""host.audit: NVML processes mapped to pods through fixture /proc trees and the kubelet's PodResources API,
served by a real gRPC server on a unix socket. A pod's process on a hidden GPU, or on a GPU the kubelet allocated to
another pod, is a violation, as is a hidden GPU the kubelet can allocate or hand out through a DRA claim; a source
that cannot be read is refused or named without silencing the others; the shipped alerting rules name only
metrics the exporter writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from common.cli import EXIT_FINDING, EXIT_UNAVAILABLE, EXIT_USAGE, UnavailableError
from host import audit
from host.report import Report
from host.watch import Watcher
from tests.support.audit_node import (
    CGROUP_LAYOUTS,
    CID,
    EXPOSED,
    HIDDEN,
    HOST_CGROUPS,
    POD,
    proc_tree,
    run_args,
    stack_file,
)
from tests.support.fake_kubelet import Kubelet, serve
from tests.support.fake_nvml import FakeGpu, fake_nvml
from tests.support.stacks import CLUSTER


@pytest.mark.parametrize("layout", CGROUP_LAYOUTS, ids=list(CGROUP_LAYOUTS))
def test_pod_and_container_from_cgroup(layout: str) -> None:
    assert audit.owner_from_cgroup(CGROUP_LAYOUTS[layout]) == audit.Owner(POD, CID)


def test_a_static_pods_uid_has_no_dashes() -> None:
    static = "6e8f3b1f0c2a4d5e9b7c1a2d3e4f5a6b"
    assert audit.owner_from_cgroup(
        f"0::/kubepods.slice/kubepods-pod{static}.slice/cri-containerd-{CID}.scope\n"
    ) == audit.Owner(static, CID)


@pytest.mark.parametrize("layout", HOST_CGROUPS, ids=list(HOST_CGROUPS))
def test_host_processes_have_no_pod(layout: str) -> None:
    assert audit.owner_from_cgroup(HOST_CGROUPS[layout]) == audit.Owner(None, None)


def log_tree(root: Path, pods: dict[str, tuple[str, str]], containers: dict[str, tuple[str, str, str]]) -> Path:
    """The kubelet's log layout: /var/log/pods/<ns>_<pod>_<uid>, /var/log/containers/<pod>_<ns>_<c>-<id>.log"""
    for uid, (namespace, pod) in pods.items():
        (root / "log" / "pods" / f"{namespace}_{pod}_{uid}").mkdir(parents=True)
    (root / "log" / "containers").mkdir(parents=True, exist_ok=True)
    for cid, (namespace, pod, container) in containers.items():
        (root / "log" / "containers" / f"{pod}_{namespace}_{container}-{cid}.log").write_text("")
    return root / "log"


def run(root: Path, gpus: list[FakeGpu], capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    status = audit.main([*run_args(root), *extra], nvml=fake_nvml(gpus))
    return status, capsys.readouterr().out


NO_SOCKET = "no kubelet PodResources socket at"


def test_pod_on_hidden_gpu_is_a_violation_even_without_the_kubelet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc_tree(
        tmp_path,
        {
            100: CGROUP_LAYOUTS["v2-systemd-containerd"],
            200: HOST_CGROUPS["v2-user-session"],
            300: CGROUP_LAYOUTS["v1-cgroupfs-containerd"],
            400: HOST_CGROUPS["v1-host-service"],
        },
    )
    log_tree(tmp_path, {POD: ("ml-team", "trainer")}, {CID: ("ml-team", "trainer", "main")})
    gpus = [
        FakeGpu(EXPOSED, compute=[(100, 2**30), (200, 2**20)]),
        FakeGpu(HIDDEN, compute=[(400, 5 * 2**30)], graphics=[(300, None)]),
    ]
    status, out = run(tmp_path, gpus, capsys, "--json")
    report = json.loads(out)
    assert status == 1
    assert report["podResources"].startswith(f"absent: {NO_SOCKET}")
    assert report["gpus"][0]["processes"][0] == {
        "pid": 100,
        "usedGpuMemoryBytes": 2**30,
        "podUid": POD,
        "namespace": "ml-team",
        "pod": "trainer",
        "container": "main",
        "containerId": CID,
    }
    assert [(v["pid"], v["namespace"], v["pod"], v["container"]) for v in report["violations"]] == [
        (300, "ml-team", "trainer", "main")
    ]
    assert [w["message"] for w in report["warnings"]] == [
        f"{NO_SOCKET} {tmp_path / 'kubelet.sock'}: allocations not checked (not a node, or a wrong path?)",
        "a process outside Kubernetes uses an exposed GPU",
    ]


def kubelet_node(tmp_path: Path) -> Kubelet:
    """gpu-node-01 as the kubelet sees it: EXPOSED allocatable, allocated to ml-team/trainer."""
    proc_tree(
        tmp_path, {100: CGROUP_LAYOUTS["v2-systemd-containerd"], 200: f"0::/kubepods/pod{OTHER_POD}/{OTHER_CID}\n"}
    )
    log_tree(
        tmp_path,
        {POD: ("ml-team", "trainer"), OTHER_POD: ("ml-team", "notebook")},
        {CID: ("ml-team", "trainer", "main"), OTHER_CID: ("ml-team", "notebook", "jupyter")},
    )
    return Kubelet(
        allocatable={"nvidia.com/gpu": [EXPOSED]},
        pods={
            ("ml-team", "trainer"): {"main": {"nvidia.com/gpu": [EXPOSED]}},
            ("ml-team", "notebook"): {"jupyter": {}},
        },
    )


OTHER_POD = "1e2f3a4b-5c6d-4e7f-8a9b-0c1d2e3f4a5b"
OTHER_CID = "a" * 64


def test_clean_node_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubelet = kubelet_node(tmp_path)
    with serve(tmp_path / "kubelet.sock", kubelet):
        status, out = run(tmp_path, [FakeGpu(EXPOSED, compute=[(100, 1)]), FakeGpu(HIDDEN)], capsys)
    assert status == 0, out
    assert "pid 100: pod ml-team/trainer container main" in out
    assert out.strip().endswith("result: 0 violation(s), 0 warning(s)")
    assert kubelet.calls == ["GetAllocatableResources", "List"]


def test_a_hidden_uuid_among_allocatable_devices_is_a_violation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubelet = kubelet_node(tmp_path)
    kubelet.allocatable["nvidia.com/gpu"].append(HIDDEN)
    with serve(tmp_path / "kubelet.sock", kubelet):
        status, out = run(tmp_path, [FakeGpu(EXPOSED), FakeGpu(HIDDEN)], capsys)
    assert status == 1
    assert f"VIOLATION {HIDDEN}: the kubelet can allocate a hidden GPU" in out


def test_a_missing_exposed_gpu_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubelet = kubelet_node(tmp_path)
    kubelet.allocatable = {}
    with serve(tmp_path / "kubelet.sock", kubelet):
        status, out = run(tmp_path, [FakeGpu(EXPOSED), FakeGpu(HIDDEN)], capsys)
    assert status == 0
    assert f"warning   {EXPOSED}: an exposed GPU is not allocatable (is the plugin running?)" in out


def test_a_pod_on_a_gpu_allocated_to_another_pod_names_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubelet = kubelet_node(tmp_path)
    with serve(tmp_path / "kubelet.sock", kubelet):
        status, out = run(tmp_path, [FakeGpu(EXPOSED, compute=[(100, 1), (200, 1)]), FakeGpu(HIDDEN)], capsys)
    assert status == 1
    assert (
        "VIOLATION GPU 0 pid 200: a pod uses a GPU the kubelet did not allocate to it; the kubelet allocated it to "
        "pod ml-team/trainer container main (pod ml-team/notebook container jupyter)"
    ) in out


def test_time_sliced_replicas_count_as_their_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubelet = kubelet_node(tmp_path)
    kubelet.allocatable = {"nvidia.com/gpu": [f"{EXPOSED}::{n}" for n in range(4)]}
    kubelet.pods[("ml-team", "trainer")] = {"main": {"nvidia.com/gpu": [f"{EXPOSED}::2"]}}
    with serve(tmp_path / "kubelet.sock", kubelet):
        status, out = run(tmp_path, [FakeGpu(EXPOSED, compute=[(100, 1)]), FakeGpu(HIDDEN)], capsys)
    assert status == 0, out


def test_gpu_missing_from_the_stack_counts_as_hidden(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc_tree(tmp_path, {100: CGROUP_LAYOUTS["v2-cgroupfs-containerd"]})
    stranger = FakeGpu("GPU-cccccccc-1111-4222-8333-444455556666", compute=[(100, 1)])
    status, _ = run(tmp_path, [FakeGpu(EXPOSED), FakeGpu(HIDDEN), stranger], capsys)
    assert status == 1


def test_process_that_exits_mid_scan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc_tree(tmp_path, {})
    status, out = run(tmp_path, [FakeGpu(EXPOSED), FakeGpu(HIDDEN, compute=[(4242, 1)])], capsys, "--json")
    report = json.loads(out)
    assert status == 0
    assert report["gpus"][1]["processes"] == []
    assert report["warnings"][1]["pid"] == 4242 and report["warnings"][1]["message"] == "process exited during the scan"


def test_an_unknown_owner_on_a_hidden_gpu_is_a_violation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc_tree(tmp_path, {88: b"0::/kubepods/\xff\xfe\n"})
    (tmp_path / "proc" / "77" / "cgroup").mkdir(parents=True)  # reading it fails with an OSError
    gpus = [FakeGpu(EXPOSED, compute=[(77, 1)]), FakeGpu(HIDDEN, compute=[(88, 1)])]
    status, out = run(tmp_path, gpus, capsys, "--json")
    report = json.loads(out)
    assert status == 1
    assert [v["pid"] for v in report["violations"]] == [88]
    assert "UnicodeDecodeError" in report["violations"][0]["message"]
    assert any(w.get("pid") == 77 and "owner unknown on a exposed GPU" in w["message"] for w in report["warnings"])


def test_a_proc_root_that_is_not_a_proc_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "proc").mkdir()
    args = ["--stack-file", str(stack_file(tmp_path)), "--node", "gpu-node-01", "--proc-root", str(tmp_path / "proc")]
    assert audit.main(args, nvml=fake_nvml([FakeGpu(EXPOSED)])) == 2
    assert "not a proc tree" in capsys.readouterr().err


def test_no_driver(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc_tree(tmp_path, {})
    args = ["--stack-file", str(stack_file(tmp_path)), "--node", "gpu-node-01", "--proc-root", str(tmp_path / "proc")]
    assert audit.main(args, nvml=fake_nvml([], init_error="LibraryNotFound")) == 3
    assert "no NVIDIA driver here" in capsys.readouterr().err


def test_gpu_exposed_by_its_mig_devices_counts_as_exposed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parent = "GPU-dddddddd-1111-4222-8333-444455556666"
    mig = "MIG-eeeeeeee-1111-4222-8333-444455556666"
    proc_tree(tmp_path, {100: CGROUP_LAYOUTS["v2-systemd-containerd"]})
    stack = tmp_path / "Pulumi.t.yaml"
    node = {
        "name": "gpu-node-01",
        "exposedGpus": [mig],
        "hiddenGpus": [HIDDEN],
        "migStrategy": "mixed",
        "migDevices": {parent: [mig]},
    }
    stack.write_text(yaml.safe_dump({"config": {**CLUSTER, "hidden-gpu:nodes": [node]}}))
    gpus = [FakeGpu(parent, mig_uuids=[mig], compute=[(100, 1)]), FakeGpu(HIDDEN)]
    args = ["--stack-file", str(stack), "--node", "gpu-node-01", "--proc-root", str(tmp_path / "proc"), "--json"]
    assert audit.main(args, nvml=fake_nvml(gpus)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"][0]["exposed"] is True and report["violations"] == []


# --- One source failing does not silence the others (issue 21, item 6) ---


def test_a_proc_root_holding_only_self_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every process would read as "exited during the scan": a clean-looking report of nothing."""
    (tmp_path / "proc" / "self").mkdir(parents=True)
    status = audit.main(run_args(tmp_path), nvml=fake_nvml([FakeGpu(EXPOSED), FakeGpu(HIDDEN, compute=[(4242, 1)])]))
    assert status == EXIT_USAGE
    assert "not a proc tree with live processes" in capsys.readouterr().err


def test_a_wrong_log_root_is_refused_not_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With names missing, a pod on a GPU allocated to another would pass as "pod not found"."""
    kubelet = kubelet_node(tmp_path)
    with serve(tmp_path / "kubelet.sock", kubelet):
        args = [*run_args(tmp_path)]
        args[args.index("--log-root") + 1] = str(tmp_path / "not-var-log")
        status = audit.main(args, nvml=fake_nvml([FakeGpu(EXPOSED, compute=[(100, 1)]), FakeGpu(HIDDEN)]))
    assert status == EXIT_USAGE
    assert "--log-root" in capsys.readouterr().err


def test_a_failing_kubelet_still_reports_what_the_processes_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung socket ends in the client's timeout: the audit says which source failed, keeps judging the
    processes (a pod on a hidden GPU is still a violation) and does not pass as clean."""
    proc_tree(tmp_path, {100: CGROUP_LAYOUTS["v2-systemd-containerd"]})

    def hung(_socket: Path) -> None:
        raise UnavailableError("the kubelet's PodResources API at kubelet.sock failed: StatusCode.DEADLINE_EXCEEDED")

    monkeypatch.setattr(audit, "read_pod_resources", hung)
    status, out = run(tmp_path, [FakeGpu(EXPOSED), FakeGpu(HIDDEN, compute=[(100, 1)])], capsys)
    assert status == EXIT_FINDING and "a pod uses a hidden GPU" in out
    assert "FAILED    kubelet PodResources: the kubelet's PodResources API" in out
    status, out = run(tmp_path, [FakeGpu(EXPOSED), FakeGpu(HIDDEN)], capsys)
    assert status == EXIT_UNAVAILABLE and out.strip().endswith("1 failed source(s)")


# PromQL words that are not metric names: functions, operators, aggregation modifiers.
PROMQL_WORDS = {"time", "absent", "and", "or", "unless", "by", "without", "on", "ignoring", "bool", "offset"}


def promql_metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers outside label matchers and strings that are
    neither a function call nor a keyword (a small parser: no package here parses PromQL)."""
    bare = re.sub(
        r"\{[^}]*\}|\"[^\"]*\"|'[^']*'|\[[^\]]*\]|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)",
        " ",
        expression,
    )
    return {
        name
        for name, call in re.findall(r"(?<![\w.])([a-zA-Z_:][\w:]*)\s*(\(?)", bare)
        if not call and name not in PROMQL_WORDS
    }


def test_promql_metric_names() -> None:
    assert promql_metric_names('time() - a_b{x="y"} > 300 and on(instance) c[5m]') == {"a_b", "c"}


def test_the_shipped_alerting_rules_name_metrics_the_exporter_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = yaml.safe_load((Path(__file__).resolve().parent.parent / "host" / "hidden-gpu-audit.rules.yml").read_text())
    alerts = {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}
    assert set(alerts) == {"HiddenGpuAuditViolation", "HiddenGpuAuditStale", "HiddenGpuAuditAbsent"}
    textfile = tmp_path / "m.prom"
    watcher = Watcher(lambda: Report("n"), 60, None, textfile)
    watcher.record(Report("n", gpus=[{"uuid": EXPOSED, "exposed": True, "processes": []}]), None)
    # The heartbeat: one line per successful scan, for the journal.
    assert capsys.readouterr().out == "scan ok: node n: 1 GPU(s), 0 GPU process(es), 0 violation(s), 0 warning(s)\n"
    written = {line.split("{")[0].split()[0] for line in textfile.read_text().splitlines() if not line.startswith("#")}
    for alert, expression in alerts.items():
        names = promql_metric_names(expression)
        assert names and names <= written, (alert, names - written)


def test_a_gpu_given_through_a_dra_claim_is_checked_by_its_minor_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """NVIDIA's DRA driver names GPUs gpu-<minor>. The trainer's claim holds the exposed GPU (minor 0), so its
    process there is allocated; the notebook's claim holds the hidden one (minor 1): a violation naming the claim,
    even before any process runs on it. A device not named by a minor is a warning, another driver's is ignored."""
    kubelet = kubelet_node(tmp_path)
    kubelet.pods[("ml-team", "trainer")] = {"main": {}}
    kubelet.claims = {
        ("ml-team", "trainer"): {"main": [("one-gpu", "gpu.nvidia.com", "gpu-node-01", "gpu-0")]},
        ("ml-team", "notebook"): {
            "jupyter": [
                ("stolen", "gpu.nvidia.com", "gpu-node-01", "gpu-1"),
                ("sliced", "gpu.nvidia.com", "gpu-node-01", "gpu-1-mig-1g-18gb-0"),
                ("nic", "nic.example.com", "gpu-node-01", "nic-0"),
            ]
        },
    }
    with serve(tmp_path / "kubelet.sock", kubelet):
        status, out = run(tmp_path, [FakeGpu(EXPOSED, compute=[(100, 1)]), FakeGpu(HIDDEN)], capsys)
    assert status == 1, out
    violations = [line for line in out.splitlines() if line.startswith("VIOLATION")]
    assert violations == [
        f"VIOLATION {HIDDEN}: the kubelet gave pod ml-team/notebook container jupyter a hidden GPU through DRA claim "
        "ml-team/stolen (device gpu-node-01/gpu-1)"
    ]
    assert "DRA device gpu-node-01/gpu-1-mig-1g-18gb-0 of claim ml-team/sliced: not mapped" in out
    assert "nic-0" not in out


def test_dra_devices_follow_the_minor_number_not_the_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Minor numbers need not follow NVML's index order: gpu-0 here is the second GPU, the hidden one."""
    kubelet = kubelet_node(tmp_path)
    kubelet.claims = {("ml-team", "notebook"): {"jupyter": [("c", "gpu.nvidia.com", "gpu-node-01", "gpu-0")]}}
    with serve(tmp_path / "kubelet.sock", kubelet):
        status, out = run(tmp_path, [FakeGpu(EXPOSED, minor=1), FakeGpu(HIDDEN, minor=0)], capsys)
    assert status == 1 and f"VIOLATION {HIDDEN}: the kubelet gave pod ml-team/notebook" in out, out
