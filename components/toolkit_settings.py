"""ToolkitSettings: the opt-in ClusterPolicy patch that closes the env-var route in the container toolkit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from common.names import PATCH_FORCE_ANNOTATION, Token

TOOLKIT_ENV = {
    # Unprivileged containers no longer get GPUs from NVIDIA_VISIBLE_DEVICES, so an image's own
    # `ENV NVIDIA_VISIBLE_DEVICES=all` and envFrom stop working as routes to hidden GPUs.
    "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED": "false",
    # Device plugins hand GPUs out as /dev/null mounts instead.
    "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS": "true",
}
# The operator's own plugins on other nodes must answer allocations the same way.
DEVICE_PLUGIN_ENV = {"DEVICE_LIST_STRATEGY": "volume-mounts"}
PATCH_NAME = "gpu-operator-cluster-policy"
CLUSTER_POLICY_API = "nvidia.com/v1"
CLUSTER_POLICY_KIND = "ClusterPolicy"


@dataclass(frozen=True)
class ToolkitSettingsArgs:
    cluster_policy: str
    """The name of the GPU Operator's ClusterPolicy."""


def merged_env(live: Any, ours: dict[str, str]) -> list[dict[str, Any]]:
    """The live env list with our entries set: every entry we do not own kept, in its order.

    The CRD declares these lists atomic (no list-map keys), so a server-side apply replaces the
    whole list: sending only ours would drop what someone else set there."""
    kept = [entry for entry in live or [] if not (isinstance(entry, dict) and entry.get("name") in ours)]
    return kept + [{"name": name, "value": value} for name, value in ours.items()]


def merged_spec(live_spec: Any) -> dict[str, Any]:
    spec = live_spec if isinstance(live_spec, dict) else {}
    toolkit, plugin = spec.get("toolkit") or {}, spec.get("devicePlugin") or {}
    return {
        "toolkit": {"env": merged_env(toolkit.get("env"), TOOLKIT_ENV)},
        "devicePlugin": {"env": merged_env(plugin.get("env"), DEVICE_PLUGIN_ENV)},
    }


class LiveClusterPolicy(pulumi.CustomResource):
    """A read of the live ClusterPolicy, at preview and at up. `k8s.apiextensions.CustomResource.get`
    reads the same object but, in Python, exposes no `spec`: an SDK resource gets attributes only
    for the properties it declares, so this one declares `spec`. A ClusterPolicy that cannot be
    read fails the preview: nothing is patched without merging."""

    spec: pulumi.Output[Any]

    def __init__(self, name: str, cluster_policy: str, opts: pulumi.ResourceOptions) -> None:
        props = {"apiVersion": CLUSTER_POLICY_API, "kind": CLUSTER_POLICY_KIND, "spec": None}
        read = pulumi.ResourceOptions(id=cluster_policy)
        super().__init__(
            f"kubernetes:{CLUSTER_POLICY_API}:{CLUSTER_POLICY_KIND}",
            name,
            props,
            pulumi.ResourceOptions.merge(opts, read),
        )


class ToolkitSettings(pulumi.ComponentResource):
    """Sets the toolkit's and the operator plugins' env in the ClusterPolicy (cluster-wide)."""

    live: LiveClusterPolicy
    """The ClusterPolicy as it is, read at every preview and up."""
    patch: k8s.apiextensions.CustomResourcePatch
    """The server-side-apply patch of the ClusterPolicy: its env lists merged, never replaced."""

    def __init__(self, name: str, args: ToolkitSettingsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(Token.TOOLKIT_SETTINGS, name, None, opts)
        self.live = LiveClusterPolicy(f"{name}-live", args.cluster_policy, pulumi.ResourceOptions(parent=self))
        self.patch = k8s.apiextensions.CustomResourcePatch(
            PATCH_NAME,
            api_version=CLUSTER_POLICY_API,
            kind=CLUSTER_POLICY_KIND,
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=args.cluster_policy,
                # The operator's Helm release owns these fields; without force the apply conflicts.
                annotations={PATCH_FORCE_ANNOTATION: "true"},
            ),
            spec=self.live.spec.apply(merged_spec),
            opts=pulumi.ResourceOptions(
                parent=self,
                # It was declared at the top of the stack before this component existed: the alias
                # keeps its URN, so the move is no delete-and-recreate.
                aliases=[pulumi.Alias(parent=pulumi.ROOT_STACK_RESOURCE)],
                # The patch owns whole lists, other people's entries included: deleting it would
                # strip them all. Leaving the stack leaves the settings; undo them by hand.
                retain_on_delete=True,
            ),
        )
        self.register_outputs({"clusterPolicy": args.cluster_policy})
