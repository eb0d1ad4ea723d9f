"""PluginNamespace: where the pinned device plugins run, and the network they do not need."""

from typing import TypedDict

import pulumi
import pulumi_kubernetes as k8s

from common.names import (
    FIELD_MANAGER,
    FIELD_MANAGER_ANNOTATION,
    PART_OF,
    PART_OF_LABEL,
    PATCH_FORCE_ANNOTATION,
    PLUGIN_NAME,
    PLUGIN_NAME_LABEL,
    PLUGIN_NETWORK_POLICY,
    POD_SECURITY_ENFORCE_LABEL,
    Token,
)


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

    def __init__(self, name: str, args: PluginNamespaceArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(Token.PLUGIN_NAMESPACE, name, None, opts)
        labels = {PART_OF_LABEL: PART_OF}
        if args["create"]:
            namespace = k8s.core.v1.Namespace(
                f"{name}-namespace",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=args["namespace"], labels={**labels, POD_SECURITY_ENFORCE_LABEL: "privileged"}
                ),
                # Deleting a namespace deletes everything in it: flipping createNamespace or
                # leaving the stack leaves it (and whatever else runs there) in place.
                opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
            )
            self.name = namespace.metadata.name
        else:
            self.name = pulumi.Output.from_input(args["namespace"])
        self.network_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-no-network",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=PLUGIN_NETWORK_POLICY,
                namespace=self.name,
                labels=labels,
                # Retained, so another `up` of any stack takes it back without a conflict.
                annotations={FIELD_MANAGER_ANNOTATION: FIELD_MANAGER, PATCH_FORCE_ANNOTATION: "true"},
            ),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels={PLUGIN_NAME_LABEL: PLUGIN_NAME}),
                policy_types=["Ingress", "Egress"],
            ),
            # Stacks that share a cluster share the plugin namespace (offline.fleet) and so this policy: one
            # stack's destroy must not open the network of the plugins the others still run there.
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
        )
        self.register_outputs({"name": self.name})
