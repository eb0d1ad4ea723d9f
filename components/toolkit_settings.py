"""ToolkitSettings: the opt-in ClusterPolicy patch that closes the env-var route in the container toolkit."""

# No `from __future__ import annotations`: Pulumi's analyzer (package/) reads the annotations as types.
from typing import Any, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from common.names import PATCH_FORCE_ANNOTATION
from common.tokens import Token
from stack_config.errors import validated
from stack_config.values import ObjectName

TOOLKIT_ENV = {
    # Unprivileged containers no longer get GPUs from NVIDIA_VISIBLE_DEVICES, so an image's own
    # `ENV NVIDIA_VISIBLE_DEVICES=all` and envFrom stop working as routes to hidden GPUs.
    "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED": "false",
    # Device plugins hand GPUs out as /dev/null mounts instead.
    "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS": "true",
}
# The operator's own plugins on other nodes must answer allocations the same way.
DEVICE_PLUGIN_ENV = {"DEVICE_LIST_STRATEGY": "volume-mounts"}
# The patch's name before it was named off the component's (an alias keeps its URN).
PATCH_NAME = "gpu-operator-cluster-policy"
CLUSTER_POLICY_API = "nvidia.com/v1"
CLUSTER_POLICY_KIND = "ClusterPolicy"


class ToolkitSettingsArgs(TypedDict):
    """A TypedDict: what Pulumi's component provider hands the component (package/)."""

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

    cluster_policy: str
    """The name of the ClusterPolicy patched. The patch itself (`patch`, a server-side apply that merges the env lists,
    never replaces them) is no output: a package's schema names only the resources of its dependencies' schemas,
    and neither a CustomResourcePatch nor the operator's ClusterPolicy is one."""

    def __init__(self, name: str, args: ToolkitSettingsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(Token.TOOLKIT_SETTINGS, name, None, opts)
        cluster_policy = validated(ObjectName, args["cluster_policy"], ("clusterPolicy",))
        # The ClusterPolicy as it is, read at every preview and up. Not an output: a package's schema can name only
        # the resources of its dependencies' schemas, and the ClusterPolicy is the operator's CRD.
        self._live = LiveClusterPolicy(f"{name}-live", cluster_policy, pulumi.ResourceOptions(parent=self))
        self.cluster_policy = cluster_policy
        k8s.apiextensions.CustomResourcePatch(
            f"{name}-cluster-policy-patch",
            api_version=CLUSTER_POLICY_API,
            kind=CLUSTER_POLICY_KIND,
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=cluster_policy,
                # The operator's Helm release owns these fields; without force the apply conflicts.
                annotations={PATCH_FORCE_ANNOTATION: "true"},
            ),
            spec=self._live.spec.apply(merged_spec),
            opts=pulumi.ResourceOptions(
                parent=self,
                # It was declared at the top of the stack before this component existed, then named
                # PATCH_NAME here: the aliases keep its URN, so neither move is a delete-and-recreate.
                aliases=[
                    pulumi.Alias(name=PATCH_NAME, parent=pulumi.ROOT_STACK_RESOURCE),
                    pulumi.Alias(name=PATCH_NAME),
                ],
                # The patch owns whole lists, other people's entries included: deleting it would
                # strip them all. Leaving the stack leaves the settings; undo them by hand.
                retain_on_delete=True,
            ),
        )
        self.register_outputs({"clusterPolicy": cluster_policy})
