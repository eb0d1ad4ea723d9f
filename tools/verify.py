"""Does the cluster see only our GPUs? Checks every node of a stack against the live API.

    python -m tools.verify --stack prod [--context admin@prod] [--kubeconfig PATH]

Per node: capacity and allocatable nvidia.com/gpu equal what the stack advertises (exposed GPUs
times time-slicing replicas), the device-plugin label is `false`, no GPU Operator device plugin
runs there, and the pinned plugin pod is Ready.
Kubeconfig and context are found as kubectl finds them. Exit 1 on any mismatch, 2 on an invalid
stack file or kubeconfig, 3 when the API server cannot be reached or refuses.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from stack_config import InvalidConfigError, NodeConfig, find_stack_file, load_stack_file
from stack_config.names import DEVICE_PLUGIN_LABEL, INSTANCE_LABEL, PART_OF, PART_OF_LABEL
from tools.cli import EXIT_FINDING, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, format_table, print_errors

GPU_RESOURCE = "nvidia.com/gpu"
# The GPU Operator's plugin DaemonSet labels its pods so.
OPERATOR_PLUGIN_SELECTOR = "app=nvidia-device-plugin-daemonset"


@dataclass(frozen=True)
class Check:
    node: str
    what: str
    expected: str
    actual: str

    @property
    def ok(self) -> bool:
        return self.expected == self.actual


def _ready(pod: Any) -> bool:
    conditions = (pod.status.conditions or []) if pod.status else []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def check_node(core: Any, node: NodeConfig, plugin_namespace: str) -> list[Check]:
    try:
        live = core.read_node(node.name)
    except ApiException as error:
        if error.status != 404:
            raise
        return [Check(node.name, "node exists", "yes", "no")]
    # What the pinned plugin advertises: exposed GPUs times time-slicing replicas.
    expected_count = str(node.advertised_gpus)
    capacity = (live.status.capacity or {}).get(GPU_RESOURCE, "0")
    allocatable = (live.status.allocatable or {}).get(GPU_RESOURCE, "0")
    label = (live.metadata.labels or {}).get(DEVICE_PLUGIN_LABEL, "<unset>")
    on_node = f"spec.nodeName={node.name}"
    operator_pods = core.list_pod_for_all_namespaces(field_selector=on_node, label_selector=OPERATOR_PLUGIN_SELECTOR)
    pinned_pods = core.list_namespaced_pod(
        plugin_namespace,
        field_selector=on_node,
        label_selector=f"{PART_OF_LABEL}={PART_OF},{INSTANCE_LABEL}={node.name}",
    )
    ready = sum(1 for pod in pinned_pods.items if _ready(pod))
    return [
        Check(node.name, f"capacity {GPU_RESOURCE}", expected_count, capacity),
        Check(node.name, f"allocatable {GPU_RESOURCE}", expected_count, allocatable),
        Check(node.name, f"label {DEVICE_PLUGIN_LABEL}", "false", label),
        Check(node.name, "GPU Operator device-plugin pods", "0", str(len(operator_pods.items))),
        Check(node.name, "pinned plugin pods Ready", "1" if node.exposed_gpus else "0", str(ready)),
    ]


def table(checks: list[Check]) -> str:
    rows = [("NODE", "CHECK", "EXPECTED", "ACTUAL", "")]
    rows += [(c.node, c.what, c.expected, c.actual, "ok" if c.ok else "MISMATCH") for c in checks]
    return format_table(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.verify", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="stack name: reads stacks/Pulumi.<stack>.yaml")
    source.add_argument("--stack-file", type=Path, help="any Pulumi stack file")
    parser.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config, as kubectl")
    parser.add_argument("--context", help="default: the kubeconfig's current context")
    args = parser.parse_args(argv)

    try:
        stack = load_stack_file(args.stack_file or find_stack_file(args.stack))
        config.load_kube_config(config_file=args.kubeconfig, context=args.context)  # type: ignore[no-untyped-call]
        core = client.CoreV1Api()
        checks = [c for node in stack.nodes for c in check_node(core, node, stack.device_plugin.namespace)]
    except (InvalidConfigError, ConfigException) as error:
        print_errors(str(error).splitlines()[0])
        return EXIT_USAGE
    except ApiException as error:
        print_errors(f"the API server answered {error.status} {error.reason}")
        return EXIT_UNAVAILABLE
    except HTTPError as error:
        print_errors(f"cannot reach the API server: {error}")
        return EXIT_UNAVAILABLE
    print(table(checks))
    failed = [c for c in checks if not c.ok]
    print(f"result: {len(failed)} mismatch(es) in {len(checks)} checks")
    return EXIT_FINDING if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
