"""ComponentResources that turn a validated StackConfig into Kubernetes objects, each `(name, args, opts)`.

The classes load on first use: the plain modules beside them (guard_rules, node_labels, stack_claims)
hold what the cluster tools compare the live cluster with, and importing those must not load Pulumi.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from components.access_guard import AccessGuard, AccessGuardArgs
    from components.device_classes import GpuDeviceClasses, GpuDeviceClassesArgs
    from components.gpu_pool import GpuPool, GpuPoolArgs
    from components.gpu_quotas import GpuQuotas, GpuQuotasArgs
    from components.hidden_gpu_node import HiddenGpuNode, HiddenGpuNodeArgs
    from components.plugin_namespace import PluginNamespace, PluginNamespaceArgs
    from components.stack_record import StackRecord, StackRecordArgs
    from components.toolkit_settings import ToolkitSettings, ToolkitSettingsArgs

_MODULES = {
    "AccessGuard": "access_guard",
    "AccessGuardArgs": "access_guard",
    "GpuDeviceClasses": "device_classes",
    "GpuDeviceClassesArgs": "device_classes",
    "GpuPool": "gpu_pool",
    "GpuPoolArgs": "gpu_pool",
    "GpuQuotas": "gpu_quotas",
    "GpuQuotasArgs": "gpu_quotas",
    "HiddenGpuNode": "hidden_gpu_node",
    "HiddenGpuNodeArgs": "hidden_gpu_node",
    "PluginNamespace": "plugin_namespace",
    "PluginNamespaceArgs": "plugin_namespace",
    "StackRecord": "stack_record",
    "StackRecordArgs": "stack_record",
    "ToolkitSettings": "toolkit_settings",
    "ToolkitSettingsArgs": "toolkit_settings",
}
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


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module 'components' has no attribute {name!r}")
    return getattr(importlib.import_module(f"components.{_MODULES[name]}"), name)
