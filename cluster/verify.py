"""Does the cluster see only our GPUs? Checks every node of a stack against the live API.

    python -m cluster.verify --stack prod [--context admin@prod] [--kubeconfig PATH]

Per node: capacity and allocatable nvidia.com/gpu equal what the stack advertises (exposed GPUs
times time-slicing replicas), the device-plugin label is `false`, no GPU Operator device plugin
runs there, and the pinned plugin pod is Ready.
Kubeconfig and context are found as kubectl finds them. Exit 1 on any mismatch, 2 on an invalid
stack file or kubeconfig, 3 when the API server cannot be reached or refuses, 4 on an internal error.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from common.cli import (
    EXIT_FINDING,
    EXIT_OK,
    UnavailableError,
    UsageError,
    add_stack_source,
    format_table,
    parser,
    run,
    stack_file,
)
from common.names import (
    DEVICE_PLUGIN_LABEL,
    GPU_RESOURCE,
    INSTANCE_LABEL,
    OPERATOR_PLUGIN_SELECTOR,
    PART_OF,
    PART_OF_LABEL,
)
from stack_config import NodeConfig, load_stack_file


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
    arguments = parser("python -m cluster.verify", __doc__)
    add_stack_source(arguments)
    arguments.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config, as kubectl")
    arguments.add_argument("--context", help="default: the kubeconfig's current context")
    args = arguments.parse_args(argv)

    def command() -> int:
        stack = load_stack_file(stack_file(args))
        try:
            config.load_kube_config(config_file=args.kubeconfig, context=args.context)  # type: ignore[no-untyped-call]
        except (ConfigException, OSError) as error:
            raise UsageError(f"kubeconfig: {error}") from None
        core = client.CoreV1Api()
        try:
            checks = [c for node in stack.nodes for c in check_node(core, node, stack.device_plugin.namespace)]
        except ApiException as error:
            raise UnavailableError(f"the API server answered {error.status} {error.reason}") from None
        except HTTPError as error:
            raise UnavailableError(f"cannot reach the API server: {error}") from None
        print(table(checks))
        failed = [c for c in checks if not c.ok]
        print(f"result: {len(failed)} mismatch(es) in {len(checks)} checks")
        return EXIT_FINDING if failed else EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
