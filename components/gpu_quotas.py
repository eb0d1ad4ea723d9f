"""GpuQuotas: how many nvidia.com/gpu each tenant namespace may request."""

from typing import TypedDict

import pulumi
import pulumi_kubernetes as k8s

from common.names import GPU_QUOTA_KEY, PART_OF, PART_OF_LABEL, QUOTA_NAME, Token


class GpuQuotasArgs(TypedDict):
    quotas: dict[str, int]
    """Namespace -> the most nvidia.com/gpu its pods may request together."""


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
                spec=k8s.core.v1.ResourceQuotaSpecArgs(hard={GPU_QUOTA_KEY: str(limit)}),
                # Named off the component since this version; the alias keeps stacks' existing quotas as they
                # are instead of deleting and creating them again.
                opts=pulumi.ResourceOptions(parent=self, aliases=[pulumi.Alias(name=f"{namespace}-gpu-quota")]),
            )
            for namespace, limit in sorted(args["quotas"].items())
        }
        self.register_outputs({"namespaces": sorted(args["quotas"])})
