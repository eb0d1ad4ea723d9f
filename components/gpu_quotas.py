"""GpuQuotas: how many nvidia.com/gpu each tenant namespace may request."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from stack_config.names import PART_OF, PART_OF_LABEL

QUOTA_NAME = "hidden-gpu-quota"
# Extended resources only take the `requests.` prefix in a ResourceQuota.
GPU_QUOTA_KEY = "requests.nvidia.com/gpu"


class GpuQuotas(pulumi.ComponentResource):
    """One ResourceQuota per namespace: a quota is namespace-wide, not per node."""

    def __init__(self, name: str, quotas: dict[str, int], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("hidden-gpu:index:GpuQuotas", name, None, opts)
        self.quotas = {
            namespace: k8s.core.v1.ResourceQuota(
                f"{namespace}-gpu-quota",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=QUOTA_NAME, namespace=namespace, labels={PART_OF_LABEL: PART_OF}
                ),
                spec=k8s.core.v1.ResourceQuotaSpecArgs(hard={GPU_QUOTA_KEY: str(limit)}),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for namespace, limit in sorted(quotas.items())
        }
        self.register_outputs({"namespaces": sorted(quotas)})
