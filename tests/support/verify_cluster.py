"""The cluster `pulumi up` of a stack leaves, served by the loopback API server of
tests/support/fake_apiserver.py, and cluster.verify run against it: shared by the tests/test_verify*.py modules."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from cluster import verify
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
from offline.program import run_program
from stack_config import parse_project_config, read_stack_file
from tests.support.fake_apiserver import Cluster, node, pod, serve

PROD = Path(__file__).resolve().parents[2] / "stacks" / "Pulumi.prod.yaml"

OPERATOR = {"app": "nvidia-device-plugin-daemonset"}
RENDERED_KINDS = {
    Token.RUNTIME_CLASS: "runtime_classes",
    Token.ADMISSION_POLICY: "policies",
    Token.ADMISSION_BINDING: "bindings",
    Token.RESOURCE_QUOTA: "quotas",
    Token.CONFIG_MAP: "config_maps",
    Token.MUTATING_POLICY: "mutating_policies",
    Token.MUTATING_BINDING: "mutating_bindings",
    Token.DAEMONSET: "daemon_sets",
    Token.SERVICE_ACCOUNT: "service_accounts",
    Token.CLUSTER_ROLE: "cluster_roles",
    Token.CLUSTER_ROLE_BINDING: "cluster_role_bindings",
    Token.NETWORK_POLICY: "network_policies",
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
