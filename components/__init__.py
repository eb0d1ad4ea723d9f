"""ComponentResources that turn a validated StackConfig into Kubernetes objects, each `(name, args, opts)`.

Every module here imports Pulumi; what the objects hold, and what the cluster tools compare the live cluster
with, is `desired/` (no Pulumi), which these wrap with resource options.
"""

from __future__ import annotations

from components.access_guard import AccessGuard, AccessGuardArgs
from components.device_classes import GpuDeviceClasses, GpuDeviceClassesArgs
from components.gpu_pool import GpuPool, GpuPoolArgs
from components.gpu_quotas import GpuQuotas, GpuQuotasArgs
from components.hidden_gpu_node import HiddenGpuNode, HiddenGpuNodeArgs
from components.plugin_namespace import PluginNamespace, PluginNamespaceArgs
from components.stack_record import StackRecord, StackRecordArgs
from components.toolkit_settings import ToolkitSettings, ToolkitSettingsArgs

__all__ = [
    "AccessGuard",
    "AccessGuardArgs",
    "GpuDeviceClasses",
    "GpuDeviceClassesArgs",
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
