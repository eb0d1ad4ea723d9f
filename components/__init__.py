"""ComponentResources that turn a validated StackConfig into Kubernetes objects, each `(name, args, opts)`."""

from components.access_guard import AccessGuard, AccessGuardArgs
from components.gpu_pool import GpuPool, GpuPoolArgs
from components.gpu_quotas import GpuQuotas, GpuQuotasArgs
from components.hidden_gpu_node import HiddenGpuNode, HiddenGpuNodeArgs
from components.plugin_namespace import PluginNamespace, PluginNamespaceArgs
from components.stack_record import StackRecord, StackRecordArgs
from components.toolkit_settings import ToolkitSettings, ToolkitSettingsArgs

__all__ = [
    "AccessGuard",
    "AccessGuardArgs",
    "GpuPool",
    "GpuPoolArgs",
    "GpuQuotas",
    "GpuQuotasArgs",
    "HiddenGpuNode",
    "HiddenGpuNodeArgs",
    "PluginNamespace",
    "PluginNamespaceArgs",
    "StackRecord",
    "StackRecordArgs",
    "ToolkitSettings",
    "ToolkitSettingsArgs",
]
