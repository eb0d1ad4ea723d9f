"""hidden-gpu: Kubernetes schedules only the GPUs a stack exposes; the others stay hidden."""

from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from components import (
    AccessGuard,
    GpuDeviceClasses,
    GpuDeviceClassesArgs,
    GpuPool,
    GpuPoolArgs,
    GpuQuotas,
    GpuQuotasArgs,
    HiddenGpuNode,
    PluginNamespace,
    PluginNamespaceArgs,
    StackRecord,
    StackRecordArgs,
    ToolkitSettings,
    ToolkitSettingsArgs,
)
from components.access_guard import guard_args
from components.hidden_gpu_node import node_args
from desired.node_labels import gpu_device_classes
from desired.stack_claims import exposed_by_node
from stack_config import InvalidConfigError, device_class_warnings, quota_warnings
from stack_config.reviewed import reviewed_stack


def handed(key: str) -> str | None:
    namespace, _, name = key.partition(":")
    return pulumi.Config(namespace).get(name)


try:
    # Only what the stack file says: not an ESC environment's, Pulumi.yaml's or --config's values.
    stack = reviewed_stack(Path(__file__).resolve().parent, pulumi.get_stack(), handed)
except InvalidConfigError as error:
    raise pulumi.RunError(f"invalid stack config: {error}") from None

for warning in (*quota_warnings(stack), *device_class_warnings(stack)):
    pulumi.log.warn(warning)

# An explicit provider does not read the stack's `kubernetes:` keys by itself.
cluster = pulumi.Config("kubernetes")
provider = k8s.Provider(
    "kubernetes",
    context=cluster.get("context"),
    kubeconfig=cluster.get("kubeconfig"),
    cluster=cluster.get("cluster"),
    # Only naming another cluster replaces the provider, and every object with it (the guard deleted and
    # created again: a window without it); a rotated kubeconfig is an update. Adding the identifier to a
    # stack replaces nothing (pulumi-kubernetes v4.25.0 provider/pkg/provider/provider.go:408-423).
    cluster_identifier=cluster.get("context") or cluster.get("cluster") or "kubeconfig",
    # A changed plugin config updates its ConfigMap in place; the DaemonSet's checksum annotation rolls
    # the pods. Without it every data change replaces the explicitly named ConfigMap.
    enable_config_map_mutable=True,
)
with_provider = pulumi.ResourceOptions(provider=provider)
plugin = stack.device_plugin

namespace = PluginNamespace(
    "device-plugin", PluginNamespaceArgs(namespace=plugin.namespace, create=plugin.create_namespace), with_provider
)
pools = {
    pool: GpuPool(f"pool-{pool}", GpuPoolArgs(pool=pool), with_provider).runtime_class.metadata.name
    for pool in sorted({node.pool for node in stack.nodes if node.pool and node.exposed_gpus})
}
# The guard first: a node's switch (which removes the operator's plugin and so opens the routes the guard closes)
# depends on every object of it, so a first `up` interrupted anywhere never leaves a hidden node unguarded.
guard = AccessGuard("access-guard", guard_args(stack), with_provider)
guarded = pulumi.ResourceOptions(provider=provider, depends_on=[guard])
nodes = [
    HiddenGpuNode(
        node.name, node_args(node, plugin, namespace.name, pools.get(node.pool or ""), stack.dra_settings), guarded
    )
    for node in stack.nodes
]
StackRecord(
    "stack-record",
    StackRecordArgs(stack=pulumi.get_stack(), namespace=namespace.name, exposed=exposed_by_node(stack.nodes)),
    with_provider,
)
device_classes = gpu_device_classes(stack)
if (dra := stack.dra_settings) is not None:
    # Tenants' claims from these are admitted by the guard's claims policy, which names them.
    GpuDeviceClasses("device-classes", GpuDeviceClassesArgs(driver=dra.driver, classes=device_classes), guarded)
GpuQuotas("gpu-quotas", GpuQuotasArgs(quotas=stack.quotas, device_classes=sorted(device_classes)), with_provider)
if stack.cluster_policy.patch:
    ToolkitSettings("toolkit-settings", ToolkitSettingsArgs(cluster_policy=stack.cluster_policy.name), with_provider)

pulumi.export("nodes", {node.name: component.summary for node, component in zip(stack.nodes, nodes, strict=True)})
