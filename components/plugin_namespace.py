"""The namespace the pinned device plugins run in."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from stack_config import DevicePluginConfig
from stack_config.names import PART_OF, PART_OF_LABEL


def plugin_namespace(plugin: DevicePluginConfig, opts: pulumi.ResourceOptions) -> pulumi.Output[str]:
    """Create the namespace, or reuse an existing one when `createNamespace: false`.

    Either way the plugin pods need the `privileged` Pod Security level there: they mount the
    kubelet's device-plugin directory from the host, which `baseline` forbids.
    """
    if not plugin.create_namespace:
        return pulumi.Output.from_input(plugin.namespace)
    namespace = k8s.core.v1.Namespace(
        "device-plugin-namespace",
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=plugin.namespace,
            labels={
                PART_OF_LABEL: PART_OF,
                "pod-security.kubernetes.io/enforce": "privileged",
            },
        ),
        opts=opts,
    )
    return namespace.metadata.name
