"""hidden-gpu: Kubernetes schedules only the GPUs a stack exposes; the others stay hidden."""

import pulumi
import pulumi_kubernetes as k8s

from components import AccessGuard, GpuQuotas, HiddenGpuNode, PluginNamespace, cluster_policy_patch
from stack_config import InvalidConfigError, parse_project_config, quota_warnings

try:
    stack = parse_project_config(pulumi.runtime.get_config_env() | pulumi.runtime.config.CONFIG.get())
except InvalidConfigError as error:
    raise pulumi.RunError(f"invalid stack config: {error}") from None

for warning in quota_warnings(stack):
    pulumi.log.warn(warning)

# An explicit provider does not read the stack's `kubernetes:` keys by itself.
cluster = pulumi.Config("kubernetes")
provider = k8s.Provider(
    "kubernetes",
    context=cluster.get("context"),
    kubeconfig=cluster.get("kubeconfig"),
    cluster=cluster.get("cluster"),
)
with_provider = pulumi.ResourceOptions(provider=provider)

namespace = PluginNamespace("device-plugin", stack.device_plugin, with_provider)
nodes = [HiddenGpuNode(node, stack.device_plugin, namespace.name, with_provider) for node in stack.nodes]
GpuQuotas("gpu-quotas", stack.quotas, with_provider)
AccessGuard("access-guard", stack.guard.mode, stack.exempt_namespaces, with_provider)
if stack.cluster_policy.patch:
    cluster_policy_patch(stack.cluster_policy.name, with_provider)

pulumi.export("nodes", {node.name: component.summary for node, component in zip(stack.nodes, nodes, strict=True)})
