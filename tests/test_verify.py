"""cluster.verify through the real kubernetes client against an API server on loopback, whose
RuntimeClasses, policies, bindings and quotas are the ones the program renders for the stack."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest

from cluster import verify
from common.cli import EXIT_FINDING, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from common.names import (
    DEFAULT_PLUGIN_NAMESPACE,
    DRA_PLUGIN_NAME,
    OPERANDS_OFF_ANNOTATION,
    PLUGIN_NAME,
    PROJECT,
    Allocator,
    plugin_labels,
)
from common.tokens import Token
from desired.node_labels import node_labels, operands_off, pinned_operands
from offline.bench import synthetic_stack
from offline.program import run_program
from stack_config import parse_project_config, read_stack_file
from tests.support.fake_apiserver import Cluster, node, pod, serve
from tests.support.stacks import dra_allocated, write_stack

PROD = Path(__file__).resolve().parent.parent / "stacks" / "Pulumi.prod.yaml"
OFF = {
    "nvidia.com/gpu.deploy.device-plugin": "false",
    "nvidia.com/gpu.deploy.gpu-feature-discovery": "false",
    "nvidia.com/gpu.deploy.mig-manager": "false",
}
OPERATOR = {"app": "nvidia-device-plugin-daemonset"}
RENDERED_KINDS = {
    Token.RUNTIME_CLASS: "runtime_classes",
    Token.ADMISSION_POLICY: "policies",
    Token.ADMISSION_BINDING: "bindings",
    Token.RESOURCE_QUOTA: "quotas",
    Token.CONFIG_MAP: "config_maps",
    Token.MUTATING_POLICY: "mutating_policies",
    Token.MUTATING_BINDING: "mutating_bindings",
}


def healthy(config: dict[str, Any], stack: str = "prod") -> Cluster:
    """The cluster as `pulumi up` of this config, as stack `stack`, leaves it: rendered objects, labelled
    nodes, Ready plugins."""
    cluster = Cluster()
    run = run_program(config, stack)
    for resource in run.kubernetes_objects:
        if resource.type in RENDERED_KINDS:
            getattr(cluster, RENDERED_KINDS[resource.type]).append(copy.deepcopy(resource.inputs))
    for entry, parsed in zip(config[f"{PROJECT}:nodes"], parse_project_config(config).nodes, strict=True):
        exposed = entry["exposedGpus"]
        cluster.nodes.append(node(entry["name"], parsed.advertised_gpus or None, node_labels(parsed)))
        cluster.nodes[-1]["metadata"]["annotations"] = {OPERANDS_OFF_ANNOTATION: operands_off(parsed)}
        # The pinned plugin (where it allocates) and operands: one Ready pod each, given exactly the exposed GPUs.
        dra_plugin = [DRA_PLUGIN_NAME] * (parsed.allocator == Allocator.DRA and bool(exposed))
        for name in [PLUGIN_NAME] * parsed.runs_plugin + dra_plugin + pinned_operands(parsed):
            env = {"NVIDIA_VISIBLE_DEVICES": ",".join(exposed)}
            labels = plugin_labels(entry["name"], name)
            cluster.pods.append(
                pod(f"{name}-{entry['name']}", DEFAULT_PLUGIN_NAMESPACE, entry["name"], labels, env=env)
            )
    cluster.nodes.append(node("cpu-node-01", None, {}))
    cluster.pods.append(pod("nvidia-device-plugin-daemonset-abcde", "gpu-operator", "gpu-node-03", OPERATOR))
    return cluster


PROD_CONFIG = read_stack_file(PROD)


def run(
    tmp_path: Path, cluster: Cluster, capsys: pytest.CaptureFixture[str], *extra: str, stack: str = "prod"
) -> tuple[int, str, str]:
    source = ["--stack", stack] if stack == "prod" else ["--stack-file", stack]
    with serve(tmp_path, cluster) as kubeconfig:
        status = verify.main([*source, "--kubeconfig", str(kubeconfig), "--context", "admin@test", *extra])
    out, err = capsys.readouterr()
    return status, out, err


def mismatches(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.endswith("MISMATCH")]


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
    assert out.strip().endswith("result: 0 mismatch(es) in 74 checks, 16 API requests")


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


def test_guard_objects_must_exist_as_declared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = healthy(PROD_CONFIG)
    binding = next(b for b in cluster.bindings if b["metadata"]["name"] == "hidden-gpu-access-guard")
    binding["spec"]["validationActions"] = ["Warn", "Audit"]  # someone relaxed prod
    policy = next(p for p in cluster.policies if p["metadata"]["name"] == "hidden-gpu-access-guard")
    policy["spec"]["validations"].pop()  # and dropped a rule
    cluster.runtime_classes.clear()
    cluster.quotas.pop()
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_FINDING
    found = {" ".join(row[1:3]) for row in mismatches(out)}
    assert "binding hidden-gpu-access-guard" in found
    assert "ValidatingAdmissionPolicy hidden-gpu-access-guard" in found
    assert "RuntimeClass hidden-gpu-pool-shared" in found
    assert any(row[0] in ("ml-training", "ml-inference") for row in mismatches(out))


def test_the_void_policy_is_checked_where_the_stack_declares_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = copy.deepcopy(PROD_CONFIG)
    config[f"{PROJECT}:guard"] = {"addVoid": True}
    stack = str(write_stack(tmp_path, config))
    cluster = healthy(config, "case")
    status, out, _ = run(tmp_path, cluster, capsys, stack=stack)
    assert status == EXIT_OK, out
    assert "MutatingAdmissionPolicy hidden-gpu-add-void" in out
    assert out.strip().endswith("in 76 checks, 18 API requests")
    cluster.mutating_policies[0]["spec"]["mutations"] = []  # someone emptied it
    cluster.mutating_bindings.clear()
    status, out, _ = run(tmp_path, cluster, capsys, stack=stack)
    assert status == EXIT_FINDING
    assert {" ".join(row[1:3]) for row in mismatches(out)} == {
        "MutatingAdmissionPolicy hidden-gpu-add-void",
        "binding hidden-gpu-add-void",
    }


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(tmp_path, healthy(PROD_CONFIG), capsys, "--json")
    report = json.loads(out)
    assert status == EXIT_OK and report["mismatches"] == 0 and report["requests"] == 16
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
    # One LIST per kind whatever the size (sixteen, DeviceClasses and ResourceSlices among them, and the six kinds
    # cluster/leftovers.py judges), and a page more per 1,000 nodes, hidden-gpu's pods (a plugin and a pinned
    # exporter per node) and all pods.
    assert len(cluster.requests) <= 20, cluster.requests
    assert out.strip().endswith("API requests") and seconds < 30


def test_throttling_and_server_errors_are_retried(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = healthy(PROD_CONFIG)
    cluster.faults = [429, 503]
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_OK, out
    assert len(cluster.requests) == 18


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


def test_a_plain_runtime_class_with_an_nvidia_handler_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The guard judges a class declared plain as plain: verify proves no such class runs NVIDIA's toolkit."""
    config = copy.deepcopy(PROD_CONFIG)
    config[f"{PROJECT}:guard"] = {"plainRuntimeClasses": ["gvisor", "sandboxed"]}
    stack = str(write_stack(tmp_path, config))
    cluster = healthy(config, "case")
    cluster.runtime_classes += [
        {"metadata": {"name": "gvisor"}, "handler": "runsc"},
        {"metadata": {"name": "sandboxed"}, "handler": "nvidia-experimental"},
    ]
    status, out, _ = run(tmp_path, cluster, capsys, stack=stack)
    assert status == EXIT_FINDING, out
    assert mismatches(out) == [
        ["cluster", "plain", "RuntimeClass", "sandboxed", "not", "NVIDIA's", "nvidia-experimental", "MISMATCH"]
    ]


def guard_policy(cluster: Cluster) -> dict[str, Any]:
    return next(p for p in cluster.policies if p["metadata"]["name"] == "hidden-gpu-access-guard")


def guard_binding(cluster: Cluster) -> dict[str, Any]:
    return next(b for b in cluster.bindings if b["metadata"]["name"] == "hidden-gpu-access-guard")


def exempt_a_tenant(cluster: Cluster) -> None:
    by_name = guard_policy(cluster)["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]
    by_name["values"].append("ml-training")


@pytest.mark.parametrize(
    ("tamper", "check"),
    [
        (lambda c: guard_policy(c)["spec"].__setitem__("failurePolicy", "Ignore"), "failurePolicy"),
        (
            lambda c: guard_policy(c)["spec"]["matchConstraints"]["resourceRules"][0].__setitem__(
                "resources", ["pods"]
            ),
            "matches",
        ),
        (exempt_a_tenant, "namespaceSelector"),
        (lambda c: guard_policy(c)["spec"]["variables"].pop(), "variables"),
        (
            lambda c: guard_policy(c)["spec"]["matchConstraints"].__setitem__(
                "namespaceSelector",
                {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["ml"]}]},
            ),
            "namespaceSelector",
        ),
        (
            lambda c: guard_binding(c)["spec"].__setitem__(
                "matchResources", {"namespaceSelector": {"matchLabels": {"x": "y"}}}
            ),
            "scope",
        ),
    ],
    ids=[
        "fails-open",
        "matches-less",
        "exempts-a-tenant",
        "variable-dropped",
        "exempts-a-label",
        "bound-to-fewer-namespaces",
    ],
)
def test_every_safety_field_of_the_live_guard_is_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tamper: Any, check: str
) -> None:
    """issue 21, 3: verify said "as declared" for a guard that exempted a tenant or failed open."""
    cluster = healthy(PROD_CONFIG)
    tamper(cluster)
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_FINDING, out
    assert [row[3] for row in mismatches(out)] == [check], out


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


def test_what_the_warn_phase_left_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 40, 1: objects made while the guard only warned are never judged again by admission. verify names each
    in a namespace the guard judges (ml-team), none in an exempt one (kube-system)."""
    cluster = healthy(PROD_CONFIG)
    cluster.namespaces = [{"metadata": {"name": n}} for n in ("ml-team", "kube-system")]
    keys = {"NVIDIA_VISIBLE_DEVICES": "all", "OTHER": "x"}
    cluster.config_maps += [
        {"metadata": {"name": "env", "namespace": "ml-team"}, "data": keys},
        {"metadata": {"name": "env", "namespace": "kube-system"}, "data": keys},
    ]
    cluster.secrets = [
        {"metadata": {"name": "s", "namespace": "ml-team"}, "data": {"NVIDIA_GDS": "ZW5hYmxlZA=="}},
        # Helm's release records are not read (about 1 MiB each, no env).
        {"metadata": {"name": "h", "namespace": "ml-team"}, "type": "helm.sh/release.v1", "data": {"NVIDIA_GDS": ""}},
    ]
    requests = [{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
    cluster.resource_claims = [
        {"metadata": {"name": "c", "namespace": "ml-team"}, "spec": {"devices": {"requests": requests}}}
    ]
    cluster.claim_templates = [
        {"metadata": {"name": "t", "namespace": "ml-team"}, "spec": {"spec": {"devices": {"requests": requests}}}}
    ]
    warned = pod("warned", "ml-team", "gpu-node-01", {})
    warned["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    cluster.pods.append(warned)
    status, out, _ = run(tmp_path, cluster, capsys)
    assert status == EXIT_FINDING
    wrong = {tuple(row[:3]) for row in mismatches(out)}
    assert wrong == {
        ("ml-team", "ConfigMap", "env:"),
        ("ml-team", "Secret", "s:"),
        ("ml-team", "ResourceClaim", "c:"),
        ("ml-team", "ResourceClaimTemplate", "t:"),
        ("ml-team", "Pod", "warned:"),
    }, out
    assert "NVIDIA_VISIBLE_DEVICES" in out and "claim-device-classes" in out and "privileged" in out


def test_a_collection_it_may_not_list_is_a_mismatch_not_a_clean_result() -> None:
    """An identity without `list secrets` (say a read-only kubeconfig made before verify read them): the leftovers of
    that kind cannot be judged, and verify says so rather than passing."""
    from cluster.leftovers import check_leftovers  # noqa: PLC0415
    from stack_config import parse_project_config  # noqa: PLC0415

    stack = parse_project_config(PROD_CONFIG)
    listed: dict[str, list[dict[str, Any]] | None] = {
        "namespaces": [],
        "configmaps": [],
        "secrets": None,
        "resourceclaims": [],
        "templates": [],
        "pods": [],
    }
    checks = [c for c in check_leftovers(stack, listed) if not c.ok]
    assert [(c.what, c.actual) for c in checks] == [
        ("list secrets (what the rollout left)", "forbidden: grant get/list")
    ]


def test_the_scoped_guard_needs_its_taint_on_every_stack_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """guard.scope sharedNodes admits untouched what cannot reach a stack node: only the taint keeps such pods off
    it. A node without it is named with the command that puts it there; a pod bound to a stack node that the
    scoped rules would deny is a leftover, one on another node is not."""
    config = {**PROD_CONFIG, "hidden-gpu:guard": {"scope": "sharedNodes"}}
    cluster = healthy(config)
    for found in cluster.nodes:
        if found["metadata"]["name"] == "gpu-node-01":
            found["spec"] = {"taints": [{"key": "hidden-gpu.io/shared-node", "value": "true", "effect": "NoSchedule"}]}
    privileged = {"containers": [{"name": "a", "image": "x", "securityContext": {"privileged": True}}]}
    cluster.namespaces = [{"metadata": {"name": "ml-team"}}]
    cluster.pods += [
        {"metadata": {"name": "elsewhere", "namespace": "ml-team"}, "spec": {**privileged, "nodeName": "cpu-node-01"}},
        {"metadata": {"name": "shared", "namespace": "ml-team"}, "spec": {**privileged, "nodeName": "gpu-node-01"}},
    ]
    status, out, _ = run(tmp_path, cluster, capsys, stack=str(write_stack(tmp_path, config, "prod")))
    assert status == EXIT_FINDING
    rows = [" ".join(row) for row in mismatches(out)]
    assert rows == [
        "gpu-node-02 taint hidden-gpu.io/shared-node (guard.scope sharedNodes) NoSchedule <none: kubectl taint node"
        " gpu-node-02 hidden-gpu.io/shared-node=true:NoSchedule> MISMATCH",
        "ml-team Pod shared: the enforcing guard would deny it none privileged MISMATCH",
    ], out


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
