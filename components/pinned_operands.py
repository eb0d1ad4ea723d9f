"""The pinned operands' DaemonSets as resources: what they hold is desired/operands.py."""

# No `from __future__ import annotations`: the components beside it are read by Pulumi's analyzer.
import pulumi
import pulumi_kubernetes as k8s

from components.inputs import as_args, derive
from desired.operands import operand_metadata, operand_spec
from stack_config.node_config import NodeConfig
from stack_config.plugin_config import DevicePluginConfig


def pinned_operand(
    prefix: str,
    operand: str,
    node_name: str | pulumi.Output[str],
    node: NodeConfig | pulumi.Output[NodeConfig],
    plugin: DevicePluginConfig,
    *,
    namespace: pulumi.Input[str],
    runtime_class: pulumi.Input[str],
    opts: pulumi.ResourceOptions,
) -> k8s.apps.v1.DaemonSet:
    """The operand's DaemonSet on this node (a PINNED_OPERANDS value): metadata from the name, known in a preview
    that knows it; the spec from the validated node."""
    return k8s.apps.v1.DaemonSet(
        f"{prefix}-{operand}",
        metadata=as_args(derive(node_name, lambda name: operand_metadata(operand, name, plugin, namespace))),
        spec=as_args(derive(node, lambda n: operand_spec(operand, n, plugin, runtime_class))),
        opts=opts,
    )
