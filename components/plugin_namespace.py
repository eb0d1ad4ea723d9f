"""PluginNamespace: where the pinned device plugins run, and the network they do not need."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from stack_config import DevicePluginConfig
from stack_config.names import PART_OF, PART_OF_LABEL, PLUGIN_NAME, PLUGIN_NAME_LABEL


class PluginNamespace(pulumi.ComponentResource):
    """Creates the namespace, or reuses an existing one when `createNamespace: false`.

    Either way the plugin pods need the `privileged` Pod Security level there: they mount the
    kubelet's device-plugin directory from the host, which `baseline` forbids. A device plugin
    talks to the kubelet over a unix socket only, so its pods get no network at all.
    """

    name: pulumi.Output[str]

    def __init__(self, name: str, plugin: DevicePluginConfig, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("hidden-gpu:index:PluginNamespace", name, None, opts)
        labels = {PART_OF_LABEL: PART_OF}
        if plugin.create_namespace:
            namespace = k8s.core.v1.Namespace(
                f"{name}-namespace",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=plugin.namespace, labels={**labels, "pod-security.kubernetes.io/enforce": "privileged"}
                ),
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.name = namespace.metadata.name
        else:
            self.name = pulumi.Output.from_input(plugin.namespace)
        k8s.networking.v1.NetworkPolicy(
            f"{name}-no-network",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{PLUGIN_NAME}-no-network", namespace=self.name, labels=labels),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels={PLUGIN_NAME_LABEL: PLUGIN_NAME}),
                policy_types=["Ingress", "Egress"],
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"name": self.name})
