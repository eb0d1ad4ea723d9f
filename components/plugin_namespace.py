"""PluginNamespace: where the pinned device plugins run, and the network they do not need."""

from typing import TypedDict

import pulumi
import pulumi_kubernetes as k8s

from common.tokens import Token
from components.inputs import as_args
from desired.plugin_namespace import namespace_metadata, network_policies


class PluginNamespaceArgs(TypedDict):
    namespace: str
    """The namespace's name."""
    create: bool
    """Create it (True), or reuse an existing one (False)."""


class PluginNamespace(pulumi.ComponentResource):
    """Creates the namespace, or reuses an existing one when `createNamespace: false`.

    Either way the plugin pods need the `privileged` Pod Security level there: they mount the
    kubelet's device-plugin directory from the host, which `baseline` forbids. A device plugin
    talks to the kubelet over a unix socket only, so its pods get no network at all.
    """

    name: pulumi.Output[str]
    """The namespace's name, resolved once it exists: plugins that use it wait for it."""
    network_policy: k8s.networking.v1.NetworkPolicy
    """No ingress, no egress for the plugin pods."""
    operands_network_policy: k8s.networking.v1.NetworkPolicy
    """For the pinned GFD and dcgm-exporter pods: no egress, ingress only to the exporter's metrics port."""

    def __init__(self, name: str, args: PluginNamespaceArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(Token.PLUGIN_NAMESPACE, name, None, opts)
        if args["create"]:
            namespace = k8s.core.v1.Namespace(
                f"{name}-namespace",
                metadata=as_args(namespace_metadata(args["namespace"])),
                # Deleting a namespace deletes everything in it: flipping createNamespace or
                # leaving the stack leaves it (and whatever else runs there) in place.
                opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
            )
            self.name = namespace.metadata.name
        else:
            self.name = pulumi.Output.from_input(args["namespace"])
        # Retained: one stack's destroy must not open the network of the pods the others still run there.
        kept = pulumi.ResourceOptions(parent=self, retain_on_delete=True)
        policies = {
            suffix: k8s.networking.v1.NetworkPolicy(
                f"{name}-{suffix}", metadata=as_args(policy["metadata"]), spec=as_args(policy["spec"]), opts=kept
            )
            for suffix, policy in network_policies(self.name).items()
        }
        self.network_policy = policies["no-network"]
        self.operands_network_policy = policies["operands-metrics-only"]
        self.register_outputs({"name": self.name})
