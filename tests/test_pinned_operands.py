"""The GPU-reading operands hidden-gpu runs itself (GFD, dcgm-exporter), pinned to a node's exposed GPUs as the plugin
is, and the GPU Operator's own held off: what the program declares, and what the stack models refuse."""

from __future__ import annotations

import json
from typing import Any

import pytest

from common.names import NFD_FEATURES_DIR, POD_RESOURCES_DIR
from common.tokens import Token
from offline.program import Declared, ProgramRun, run_program
from stack_config import InvalidConfigError, parse_project_config
from tests.support.objects import env_of, only, plugins
from tests.support.stacks import EXPOSED, HIDDEN, changed, node, time_sliced, with_mig

PINNED_GFD = {"gpuFeatureDiscovery": "pinned"}


def operands(run: ProgramRun, operand: str) -> list[Declared]:
    return [d for d in run.of_type(Token.DAEMONSET) if d.name.endswith(f"-{operand}")]


def pod_spec(daemon_set: Declared) -> dict[str, Any]:
    spec: dict[str, Any] = daemon_set.inputs["spec"]["template"]["spec"]
    return spec


def with_operands(config: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    node(config)["operands"] = settings
    return config


@pytest.mark.parametrize("operand", ["gpu-feature-discovery", "dcgm-exporter"])
def test_each_pinned_operand_reads_only_the_exposed_gpus_on_its_node_unprivileged(operand: str) -> None:
    run = run_program(with_operands(changed(lambda c: None), PINNED_GFD), "test")
    daemon_set = only(operands(run, operand))
    plugin = only(plugins(run))
    spec = pod_spec(daemon_set)
    (container,) = spec["containers"]
    assert env_of(container)["NVIDIA_VISIBLE_DEVICES"] == EXPOSED
    assert container["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    # The plugin's node, runtime class, tolerations, priority and pull secrets; no API token.
    for key in ("affinity", "runtimeClassName", "tolerations", "priorityClassName", "automountServiceAccountToken"):
        assert spec[key] == pod_spec(plugin)[key], key
    assert spec["automountServiceAccountToken"] is False
    assert daemon_set.inputs["metadata"]["name"] == f"{operand}-gpu-node-01"
    assert daemon_set.inputs["metadata"]["labels"]["app.kubernetes.io/name"] == operand
    # After the switch that takes the operator's own off the node.
    patch = next(r for r in run.of_type(Token.NODE_PATCH) if r.inputs["metadata"]["name"] == "gpu-node-01")
    assert patch.urn in daemon_set.dependencies
    assert all(hidden not in json.dumps(daemon_set.inputs) for hidden in HIDDEN)


def test_gfd_writes_nfds_features_file_from_the_plugins_image() -> None:
    run = run_program(with_operands(changed(lambda c: None), PINNED_GFD), "test")
    gfd = only(operands(run, "gpu-feature-discovery"))
    (container,) = pod_spec(gfd)["containers"]
    assert container["image"] == only(plugins(run)).inputs["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["command"] == ["gpu-feature-discovery"]
    # v0.20.0 would otherwise write NodeFeature objects, which needs an API token.
    assert env_of(container)["GFD_USE_NODE_FEATURE_API"] == "false"
    assert container["volumeMounts"] == [{"name": "output-dir", "mountPath": NFD_FEATURES_DIR}]
    assert pod_spec(gfd)["volumes"] == [
        {"name": "output-dir", "hostPath": {"path": NFD_FEATURES_DIR, "type": "DirectoryOrCreate"}}
    ]


def test_a_time_sliced_nodes_gfd_reads_the_plugins_config() -> None:
    run = run_program(with_operands(time_sliced(4), PINNED_GFD), "test")
    gfd = only(operands(run, "gpu-feature-discovery"))
    (container,) = pod_spec(gfd)["containers"]
    assert env_of(container)["CONFIG_FILE"] == ("/etc/nvidia-device-plugin/config.yaml")
    config = only([c for c in run.of_type(Token.CONFIG_MAP) if c.name.endswith("-plugin-config")])
    assert config.urn in gfd.dependencies
    volume = next(v for v in pod_spec(gfd)["volumes"] if v["name"] == "plugin-config")
    assert volume["configMap"]["name"] == config.inputs["metadata"]["name"]


def test_the_exporter_is_the_default_where_a_gpu_is_exposed_and_reads_pods_read_only() -> None:
    run = run_program(changed(lambda c: None), "test")
    exporter = only(operands(run, "dcgm-exporter"))  # gpu-node-01 only: gpu-node-02 hides every GPU
    (container,) = pod_spec(exporter)["containers"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9400}]
    assert "livenessProbe" not in container and "readinessProbe" not in container  # /health tells nothing
    assert container["volumeMounts"] == [{"name": "pod-resources", "mountPath": POD_RESOURCES_DIR, "readOnly": True}]
    assert "DCGM_REMOTE_HOSTENGINE_INFO" not in env_of(container)
    assert operands(run, "gpu-feature-discovery") == []
    labels = {r.inputs["metadata"]["name"]: r.inputs["metadata"]["labels"] for r in run.of_type(Token.NODE_PATCH)}
    assert all(labels[n]["nvidia.com/gpu.deploy.dcgm-exporter"] == "false" for n in ("gpu-node-01", "gpu-node-02"))


def test_false_runs_neither_and_a_mig_node_gets_no_exporter_by_default() -> None:
    run = run_program(with_operands(changed(lambda c: None), {"dcgmExporter": False}), "test")
    assert operands(run, "dcgm-exporter") == []
    assert operands(run_program(with_mig(), "test"), "dcgm-exporter") == []


@pytest.mark.parametrize(
    ("settings", "change", "message"),
    [
        (
            {"gpuFeatureDiscovery": True},
            None,
            "operands.gpuFeatureDiscovery = true: the GPU Operator's own reads every GPU of the node, the hidden ones "
            "too: `pinned` runs one that sees only the exposed GPUs, or `false`",
        ),
        ({"dcgmExporter": True}, None, "operands.dcgmExporter = true: the GPU Operator's own reads every GPU"),
        (
            {"dcgmExporter": "pinned"},
            {"exposedGpus": [], "hiddenGpus": [EXPOSED, *HIDDEN]},
            'operands.dcgmExporter = "pinned": the node exposes no GPU, so a pinned one would read none: set `false`',
        ),
        (
            {"gpuFeatureDiscovery": "pinned"},
            {"migStrategy": "single"},
            'operands.gpuFeatureDiscovery = "pinned": not with a MIG strategy yet',
        ),
        ({"dcgmExporter": "yes"}, None, "operands.dcgmExporter = \"yes\": must be one of 'pinned' or 'off'"),
    ],
)
def test_what_would_read_a_hidden_gpu_or_nothing_is_refused(
    settings: dict[str, Any], change: dict[str, Any] | None, message: str
) -> None:
    config = with_operands(changed(lambda c: None), settings)
    node(config).update(change or {})
    with pytest.raises(InvalidConfigError) as raised:
        parse_project_config(config)
    assert message in str(raised.value)


def test_every_field_ref_states_its_api_version() -> None:
    """A fieldRef is applied whole (an atomic struct): one left to the API server's default `v1` makes an `up` that
    creates the object again under another field manager (after an interrupted one) conflict with it."""

    def field_refs(value: object) -> list[dict[str, Any]]:
        if isinstance(value, dict):
            own = [value["fieldRef"]] if "fieldRef" in value else []
            return own + [ref for item in value.values() for ref in field_refs(item)]
        return [ref for item in value for ref in field_refs(item)] if isinstance(value, list) else []

    run = run_program(with_operands(changed(lambda c: None), PINNED_GFD), "test")
    refs = [ref for d in run.kubernetes_objects for ref in field_refs(d.inputs)]
    assert refs and all(ref.get("apiVersion") == "v1" for ref in refs), refs


def test_the_operands_pods_get_no_egress_and_only_the_metrics_port() -> None:
    run = run_program(with_operands(changed(lambda c: None), PINNED_GFD), "test")
    policy = next(p.inputs for p in run.of_type(Token.NETWORK_POLICY) if p.name.endswith("-operands-metrics-only"))
    (selected,) = policy["spec"]["podSelector"]["matchExpressions"]
    for operand in ("gpu-feature-discovery", "dcgm-exporter"):
        labels = only(operands(run, operand)).inputs["spec"]["template"]["metadata"]["labels"]
        assert labels[selected["key"]] in selected["values"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and "egress" not in policy["spec"]
    assert policy["spec"]["ingress"] == [{"ports": [{"port": 9400, "protocol": "TCP"}]}]
