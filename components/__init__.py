"""ComponentResources that turn a validated StackConfig into Kubernetes objects."""

from components.gpu_quotas import GpuQuotas
from components.hidden_gpu_node import HiddenGpuNode
from components.plugin_namespace import plugin_namespace

__all__ = ["GpuQuotas", "HiddenGpuNode", "plugin_namespace"]
