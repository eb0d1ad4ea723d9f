"""ComponentResources that turn a validated StackConfig into Kubernetes objects."""

from components.access_guard import AccessGuard
from components.cluster_policy import cluster_policy_patch
from components.gpu_quotas import GpuQuotas
from components.hidden_gpu_node import HiddenGpuNode
from components.plugin_namespace import PluginNamespace

__all__ = ["AccessGuard", "GpuQuotas", "HiddenGpuNode", "PluginNamespace", "cluster_policy_patch"]
