"""GpuQuotas: how many nvidia.com/gpu each tenant namespace may request."""

from typing import NotRequired, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from common.names import PART_OF, PART_OF_LABEL, QUOTA_NAME
from common.tokens import Token
from desired.node_labels import quota_hard


class GpuQuotasArgs(TypedDict):
    quotas: dict[str, int]
    """Namespace -> the most nvidia.com/gpu its pods may request together."""
    device_classes: NotRequired[list[str]]
    """The stack's GPU DeviceClasses: each is capped at the same number of devices per namespace (a quota caps one
    resource name at a time, so the plugin's GPUs and each class's are counted apart)."""


class GpuQuotas(pulumi.ComponentResource):
    """One ResourceQuota per namespace: a quota is namespace-wide, not per node."""

    quotas: dict[str, k8s.core.v1.ResourceQuota]
    """The ResourceQuota of each namespace."""

    def __init__(self, name: str, args: GpuQuotasArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(Token.GPU_QUOTAS, name, None, opts)
        self.quotas = {
            namespace: k8s.core.v1.ResourceQuota(
                f"{name}-{namespace}",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=QUOTA_NAME, namespace=namespace, labels={PART_OF_LABEL: PART_OF}
                ),
                spec=k8s.core.v1.ResourceQuotaSpecArgs(hard=quota_hard(limit, args.get("device_classes", []))),
                # Named off the component since this version; the alias keeps stacks' existing quotas as they
                # are instead of deleting and creating them again.
                opts=pulumi.ResourceOptions(parent=self, aliases=[pulumi.Alias(name=f"{namespace}-gpu-quota")]),
            )
            for namespace, limit in sorted(args["quotas"].items())
        }
        self.register_outputs({"namespaces": sorted(args["quotas"])})
