"""cluster.verify through the real kubernetes client against an API server on loopback, whose
RuntimeClasses, policies, bindings and quotas are the ones the program renders for the stack. A healthy cluster
passes; each node's plugin and pinned operands must be given exactly its exposed GPUs, and NVIDIA's operator's own,
which read every GPU, are named with their DaemonSet; another stack listing the same node is a mismatch. The API
server's throttling and errors are retried, one that keeps failing or cannot be reached is status 3, a thousand
nodes take a handful of requests, and verify uses the stack's own kubeconfig and context or says which is wrong."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cluster import verify
from common.cli import EXIT_FINDING, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from common.names import PROJECT
from offline.bench import synthetic_stack
from tests.support.fake_apiserver import node, pod, serve
from tests.support.stacks import write_stack
from tests.support.verify_cluster import OPERATOR, PROD_CONFIG, healthy, mismatches, run


def test_healthy_cluster_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(tmp_path, healthy(PROD_CONFIG), capsys)
    assert status == EXIT_OK, out
    assert "MISMATCH" not in out
    assert [
        "cluster",
        "ValidatingAdmissionPolicy",
        "hidden-gpu-access-guard",
        "rules",
        "as",
        "declared",
        "as",
        "declared",
        "ok",
    ] in [line.split() for line in out.splitlines()]
    assert out.strip().endswith("result: 0 mismatch(es) in 81 checks, 22 API requests")


def test_operator_plugin_still_advertising_every_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = healthy(PROD_CONFIG)
    cluster.nodes[0] = node("gpu-node-01", 8, {"nvidia.com/gpu.deploy.device-plugin": "true"})
    theirs = pod("nvidia-device-plugin-daemonset-zzzzz", "gpu-operator", "gpu-node-01", OPERATOR)
    theirs["metadata"]["ownerReferences"] = [
        {"kind": "DaemonSet", "name": "nvidia-device-plugin-daemonset", "controller": True}
    ]
    cluster.pods.append(theirs)
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_FINDING
    assert ["gpu-node-01", "capacity", "nvidia.com/gpu", "2", "8", "MISMATCH"] in mismatches(out)
    # The node and the DaemonSet that put the operator's plugin there, named.
    assert [
        "gpu-node-01", "GPU", "Operator", "device-plugin", "pods", "0",
        "1", "(gpu-operator/DaemonSet", "nvidia-device-plugin-daemonset)", "MISMATCH",
    ] in mismatches(out)  # fmt: skip


@pytest.mark.parametrize(("app", "daemon_set"), [("gpu-feature-discovery",) * 2, ("nvidia-dcgm-exporter",) * 2])
def test_an_operator_operand_that_reads_every_gpu_is_named_on_a_hidden_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], app: str, daemon_set: str
) -> None:
    """The operator's GFD labels, and its dcgm-exporter exports, every GPU of the node: on a stack node, a finding
    naming the node and the DaemonSet, even where every GPU is hidden."""
    cluster = healthy(PROD_CONFIG)
    theirs = pod(f"{daemon_set}-zzzzz", "gpu-operator", "gpu-node-02", {"app": app})
    theirs["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": daemon_set, "controller": True}]
    cluster.pods.append(theirs)
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_FINDING
    assert mismatches(out) == [
        ["gpu-node-02", "GPU", "Operator", app, "pods", "0", "1", "(gpu-operator/DaemonSet", f"{daemon_set})",
         "MISMATCH"],
    ]  # fmt: skip


def test_a_pinned_exporter_given_a_hidden_gpu_or_missing_is_a_mismatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = healthy(PROD_CONFIG)
    (exporter,) = [p for p in cluster.pods if p["metadata"]["labels"].get("app.kubernetes.io/name") == "dcgm-exporter"]
    hidden = PROD_CONFIG[f"{PROJECT}:nodes"][0]["hiddenGpus"][0]
    exporter["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": hidden}]
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_FINDING
    exposed = ",".join(PROD_CONFIG[f"{PROJECT}:nodes"][0]["exposedGpus"])
    assert mismatches(out) == [["gpu-node-01", "dcgm-exporter", "NVIDIA_VISIBLE_DEVICES", exposed, hidden, "MISMATCH"]]
    cluster.pods.remove(exporter)
    status, out, _ = run(tmp_path, cluster, capsys)
    assert mismatches(out) == [
        ["gpu-node-01", "pinned", "dcgm-exporter", "pods", "Ready", "1", "0", "MISMATCH"],
        ["gpu-node-01", "dcgm-exporter", "NVIDIA_VISIBLE_DEVICES", exposed, "<no", "dcgm-exporter", "pod>", "MISMATCH"],
    ]


def test_the_right_count_of_the_wrong_gpus_is_a_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Identity, not count: two GPUs advertised, but the plugin was given a hidden one."""
    cluster = healthy(PROD_CONFIG)
    hidden = PROD_CONFIG[f"{PROJECT}:nodes"][0]["hiddenGpus"][0]
    exposed = PROD_CONFIG[f"{PROJECT}:nodes"][0]["exposedGpus"]
    cluster.pods[0]["spec"]["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": f"{exposed[0]},{hidden}"}
    ]
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_FINDING
    assert [row[:5] for row in mismatches(out)] == [
        ["gpu-node-01", "plugin", "NVIDIA_VISIBLE_DEVICES", ",".join(exposed), f"{exposed[0]},{hidden}"]
    ]


def test_a_pinned_pod_widened_beyond_its_gpus_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Identity, not only the first container's variable: a pinned plugin made privileged, given a capability, a
    sidecar that names no GPU (its image's `all`) or an init container given a hidden one each reach more than the
    exposed GPUs, and each is named with its pod and container."""
    cluster = healthy(PROD_CONFIG)
    plugin = cluster.pods[0]
    name = plugin["metadata"]["name"]
    hidden = PROD_CONFIG[f"{PROJECT}:nodes"][0]["hiddenGpus"][0]
    plugin["spec"]["containers"][0]["securityContext"] = {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}
    plugin["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})
    plugin["spec"]["initContainers"] = [
        {"name": "wait-for-other-plugins", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": hidden}]}
    ]
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_FINDING
    ((row,),) = [[line] for line in out.splitlines() if "nothing wider" in line and "MISMATCH" in line]
    for found in (
        f"{name}: c privileged",
        f"{name}: c adds SYS_ADMIN",
        f"{name}: sidecar NVIDIA_VISIBLE_DEVICES=<unset: the image sees all>",
        f"{name}: wait-for-other-plugins NVIDIA_VISIBLE_DEVICES={hidden}",
    ):
        assert found in row, row
    assert len(mismatches(out)) == 1


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(tmp_path, healthy(PROD_CONFIG), capsys, "--json")
    report = json.loads(out)
    assert status == EXIT_OK and report["mismatches"] == 0 and report["requests"] == 22
    assert all(c["ok"] for c in report["checks"])


@pytest.mark.slow
def test_a_thousand_nodes_take_a_handful_of_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {**synthetic_stack(1000), "kubernetes:context": "admin@test"}
    cluster = healthy(config, "fleet")
    stack = write_stack(tmp_path, config, "fleet")
    with serve(tmp_path, cluster) as kubeconfig:
        start = time.perf_counter()
        status = verify.main(["--stack-file", str(stack), "--kubeconfig", str(kubeconfig)])
        seconds = time.perf_counter() - start
    out = capsys.readouterr().out
    assert status == EXIT_OK, out[-2000:]
    # One LIST per kind whatever the size (twenty-two, DeviceClasses and ResourceSlices among them, the six kinds
    # cluster/leftovers.py judges and the six cluster/declared.py compares), and a page more per 1,000 nodes,
    # hidden-gpu's pods and DaemonSets (a plugin and a pinned exporter per node) and all pods.
    assert len(cluster.requests) <= 28, cluster.requests
    assert out.strip().endswith("API requests") and seconds < 30


def test_throttling_and_server_errors_are_retried(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = healthy(PROD_CONFIG)
    cluster.faults = [429, 503]
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_OK, out
    assert len(cluster.requests) == 24


@pytest.mark.slow  # waits out its deadline or retries (1-2 s): make test-all
def test_a_server_that_keeps_failing_is_unavailable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = healthy(PROD_CONFIG)
    cluster.faults = [500] * 4
    status, out, err = run(tmp_path, cluster, capsys)
    assert (status, out) == (EXIT_UNAVAILABLE, "")
    assert err == "error: the API server answered 500 to GET /api/v1/nodes, 4 times\n"


def test_a_malformed_answer_is_one_line_and_status_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = healthy(PROD_CONFIG)
    cluster.faults = ["malformed"]
    status, _, err = run(tmp_path, cluster, capsys)
    assert status == EXIT_UNAVAILABLE
    assert err == "error: malformed answer to GET /api/v1/nodes: not JSON\n"


@pytest.mark.slow  # waits out its deadline or retries (1-2 s): make test-all
def test_an_unreachable_server(tmp_path: Path, capsys: pytest.CaptureFixture[str], unused_port: int) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{unused_port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "admin@test", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    status = verify.main(
        ["--stack", "prod", "--kubeconfig", str(kubeconfig), "--context", "admin@test", "--deadline", "5"]
    )
    err = capsys.readouterr().err
    assert status == EXIT_UNAVAILABLE and err.startswith("error: cannot reach the API server") and err.count("\n") == 1


def test_the_stacks_own_cluster_is_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not whatever context is current: the stack's kubernetes:kubeconfig and kubernetes:context."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "someone-elses-kubeconfig"))
    cluster = healthy(PROD_CONFIG, "own")
    with serve(tmp_path, cluster) as kubeconfig:
        config = {**PROD_CONFIG, "kubernetes:context": "admin@test", "kubernetes:kubeconfig": str(kubeconfig)}
        status = verify.main(["--stack-file", str(write_stack(tmp_path, config, "own"))])
    assert status == EXIT_OK, capsys.readouterr()
    assert cluster.requests


def test_another_stack_listing_the_same_node_or_gpu_is_a_mismatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two stacks for one cluster: both would pass on their own; each one's record betrays the other."""
    cluster = healthy(PROD_CONFIG)
    other = healthy(PROD_CONFIG, "prod-copy").config_maps
    cluster.config_maps += [c for c in other if "stack" in c["metadata"]["name"]]
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_FINDING
    assert mismatches(out) == [
        [node, "other", "stacks", "listing", "it", "or", "its", "GPUs", "none", "prod-copy", "MISMATCH"]
        for node in ("gpu-node-01", "gpu-node-02")
    ]


def test_a_context_the_kubeconfig_lacks_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serve(tmp_path, healthy(PROD_CONFIG)) as kubeconfig:
        status = verify.main(["--stack", "prod", "--kubeconfig", str(kubeconfig)])  # the stack says admin@prod
    assert status == EXIT_USAGE
    assert capsys.readouterr().err.startswith("error: kubeconfig (context admin@prod):")


def test_a_kubeconfig_that_does_not_exist_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 42, 5: the client said "Invalid kube-config file. No configuration found." for a missing path."""
    status = verify.main(["--stack", "prod", "--kubeconfig", str(tmp_path / "nonexistent")])
    assert status == EXIT_USAGE
    assert capsys.readouterr().err == f"error: --kubeconfig {tmp_path / 'nonexistent'}: no such file\n"
