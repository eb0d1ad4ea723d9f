"""The opt-in patch of the GPU Operator's ClusterPolicy that closes the env-var route in the toolkit."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

TOOLKIT_ENV = {
    # Unprivileged containers no longer get GPUs from NVIDIA_VISIBLE_DEVICES, so an image's own
    # `ENV NVIDIA_VISIBLE_DEVICES=all` and envFrom stop working as routes to hidden GPUs.
    "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED": "false",
    # Device plugins hand GPUs out as /dev/null mounts instead.
    "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS": "true",
}
# The operator's own plugins on other nodes must answer allocations the same way.
DEVICE_PLUGIN_ENV = {"DEVICE_LIST_STRATEGY": "volume-mounts"}


def _env(values: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in values.items()]


def cluster_policy_patch(name: str, opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResourcePatch:
    return k8s.apiextensions.CustomResourcePatch(
        "gpu-operator-cluster-policy",
        api_version="nvidia.com/v1",
        kind="ClusterPolicy",
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=name,
            # The operator's Helm release owns these fields; without force the apply conflicts.
            annotations={"pulumi.com/patchForce": "true"},
        ),
        spec={"toolkit": {"env": _env(TOOLKIT_ENV)}, "devicePlugin": {"env": _env(DEVICE_PLUGIN_ENV)}},
        opts=opts,
    )
