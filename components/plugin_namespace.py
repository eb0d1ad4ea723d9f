"""PluginNamespace: where the pinned device plugins run, and the network they do not need."""

from typing import TypedDict

import pulumi
import pulumi_kubernetes as k8s

from common.names import (
    DCGM_EXPORTER_PORT,
    FIELD_MANAGER,
    FIELD_MANAGER_ANNOTATION,
    OPERANDS_NETWORK_POLICY,
    PART_OF,
    PART_OF_LABEL,
    PATCH_FORCE_ANNOTATION,
    PINNED_OPERANDS,
    PLUGIN_NAME,
    PLUGIN_NAME_LABEL,
    PLUGIN_NETWORK_POLICY,
    POD_SECURITY_ENFORCE_LABEL,
)
from common.tokens import Token


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
        # Retained, and taken back by another `up` of any stack without a conflict: stacks that share a cluster share
        # the plugin namespace (offline.fleet) and so these policies, and one stack's destroy must not open the
        # network of the pods the others still run there.
        shared = {FIELD_MANAGER_ANNOTATION: FIELD_MANAGER, PATCH_FORCE_ANNOTATION: "true"}
        kept = pulumi.ResourceOptions(parent=self, retain_on_delete=True)
        self.network_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-no-network",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=PLUGIN_NETWORK_POLICY, namespace=self.name, labels=labels, annotations=shared
            ),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels={PLUGIN_NAME_LABEL: PLUGIN_NAME}),
                policy_types=["Ingress", "Egress"],
            ),
            opts=kept,
        )
        # The exporter reads GPUs and the kubelet's PodResources over local files and a unix socket: it needs no
        # egress, and only its metrics port is reachable (from wherever the platform's Prometheus runs).
        operands = k8s.meta.v1.LabelSelectorRequirementArgs(
            key=PLUGIN_NAME_LABEL, operator="In", values=sorted(PINNED_OPERANDS.values())
        )
        self.operands_network_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-operands-metrics-only",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=OPERANDS_NETWORK_POLICY, namespace=self.name, labels=labels, annotations=shared
            ),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_expressions=[operands]),
                policy_types=["Ingress", "Egress"],
                ingress=[
                    k8s.networking.v1.NetworkPolicyIngressRuleArgs(
                        ports=[k8s.networking.v1.NetworkPolicyPortArgs(port=DCGM_EXPORTER_PORT, protocol="TCP")]
                    )
                ],
            ),
            opts=kept,
        )
        self.register_outputs({"name": self.name})
