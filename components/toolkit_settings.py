"""ToolkitSettings: the opt-in ClusterPolicy patch that closes the env-var route in the container toolkit."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class ToolkitSettingsArgs:
    cluster_policy: str
    """The name of the GPU Operator's ClusterPolicy."""


def _env(values: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in values.items()]


class ToolkitSettings(pulumi.ComponentResource):
    """Sets the toolkit's and the operator plugins' env in the ClusterPolicy (cluster-wide)."""

    patch: k8s.apiextensions.CustomResourcePatch
    """The server-side-apply patch of the ClusterPolicy."""

    def __init__(self, name: str, args: ToolkitSettingsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(Token.TOOLKIT_SETTINGS, name, None, opts)
        self.patch = k8s.apiextensions.CustomResourcePatch(
            PATCH_NAME,
            api_version="nvidia.com/v1",
            kind="ClusterPolicy",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=args.cluster_policy,
                # The operator's Helm release owns these fields; without force the apply conflicts.
                annotations={PATCH_FORCE_ANNOTATION: "true"},
            ),
            spec={"toolkit": {"env": _env(TOOLKIT_ENV)}, "devicePlugin": {"env": _env(DEVICE_PLUGIN_ENV)}},
            # It was declared at the top of the stack before this component existed: the alias keeps
            # its URN, so moving it here is no delete-and-recreate (which would drop the fields).
            opts=pulumi.ResourceOptions(parent=self, aliases=[pulumi.Alias(parent=pulumi.ROOT_STACK_RESOURCE)]),
        )
        self.register_outputs({"clusterPolicy": args.cluster_policy})
