"""The pinned device plugins' settings (`hidden-gpu:devicePlugin`): image, namespace, resources, tolerations."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from common.names import (
    DEFAULT_DCGM_EXPORTER_IMAGE,
    DEFAULT_PLUGIN_IMAGE,
    DEFAULT_PLUGIN_NAMESPACE,
    PLUGIN_PRIORITY_CLASS,
    DeviceListStrategy,
    ToolkitSettingsSource,
)
from stack_config.values import (
    HostPath,
    ImageRef,
    LaxEnum,
    NamespaceName,
    ObjectName,
    Quantity,
    StrictModel,
    raise_problems,
)


class ResourceAmounts(StrictModel):
    """CPU and memory, as Kubernetes quantities."""

    cpu: Quantity
    """CPU, e.g. `50m`."""
    memory: Quantity
    """Memory, e.g. `64Mi`."""


# Kubernetes quantity suffixes (apimachinery resource.Quantity): binary powers of 1024, decimal powers of 1000.
_QUANTITY_SCALE: dict[str, Decimal] = {"": Decimal(1), "m": Decimal("0.001")}
_QUANTITY_SCALE |= {suffix: Decimal(1000**power) for power, suffix in enumerate(("k", "M", "G", "T"), 1)}
_QUANTITY_SCALE |= {suffix: Decimal(1024**power) for power, suffix in enumerate(("Ki", "Mi", "Gi", "Ti"), 1)}
PLUGIN_DEFAULT_RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}


def quantity_value(text: str) -> Decimal:
    """The amount a quantity QUANTITY accepts stands for: `500m` is 0.5, `64Mi` is 67108864."""
    number = re.match(r"[0-9.]+", text)
    assert number is not None  # QUANTITY checked it
    return Decimal(number.group()) * _QUANTITY_SCALE[text[number.end() :]]


class PluginResources(StrictModel):
    """The plugin container's requests and limits (the Helm chart's `resources`). A partial override keeps
    the defaults of what it does not name (`limits: {memory: 512Mi}` keeps the CPU limit)."""

    requests: ResourceAmounts = ResourceAmounts.model_validate(PLUGIN_DEFAULT_RESOURCES["requests"])
    """What keeps the plugin placeable on a busy node."""
    limits: ResourceAmounts = ResourceAmounts.model_validate(PLUGIN_DEFAULT_RESOURCES["limits"])
    """What bounds a leak."""

    @model_validator(mode="before")
    @classmethod
    def _defaults_under_overrides(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {
            key: {**PLUGIN_DEFAULT_RESOURCES[key], **value}
            if key in PLUGIN_DEFAULT_RESOURCES and isinstance(value, dict)
            else value
            for key, value in data.items()
        }

    @model_validator(mode="after")
    def _requests_within_limits(self) -> PluginResources:
        # The API server refuses a container whose request exceeds its limit: say so offline, not at `up`.
        raise_problems(
            (("requests", kind), getattr(self.requests, kind), f"above its limit {getattr(self.limits, kind)}")
            for kind in ("cpu", "memory")
            if quantity_value(getattr(self.requests, kind)) > quantity_value(getattr(self.limits, kind))
        )
        return self


class Toleration(StrictModel):
    """A toleration, as in a pod spec."""

    key: str | None = None
    """The taint key; empty with `Exists` tolerates every taint."""
    operator: Literal["Exists", "Equal"] = "Exists"
    """`Exists` or `Equal`."""
    value: str | None = None
    """The taint value, with `Equal`."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """The taint effect; empty tolerates all."""


class DevicePluginConfig(StrictModel):
    """The pinned device plugins, one DaemonSet per node that exposes GPUs."""

    image: ImageRef = DEFAULT_PLUGIN_IMAGE
    """Plugin image, pinned by tag or digest; not `:latest`."""
    namespace: NamespaceName = DEFAULT_PLUGIN_NAMESPACE
    """Namespace of the plugin pods; always exempt from the access guard."""
    create_namespace: bool = True
    """Create the namespace (labelled Pod Security `privileged`: the plugin mounts a host directory). `false`: reuse an
    existing one that allows the same."""
    device_list_strategy: Annotated[DeviceListStrategy, LaxEnum] = DeviceListStrategy.ENVVAR
    """`envvar` (the recipe's) or `volume-mounts`: the plugin hands GPUs out as `/dev/null` mounts, for a toolkit that
    ignores `NVIDIA_VISIBLE_DEVICES` from unprivileged pods."""
    tolerations: list[Toleration] = Field(
        default_factory=lambda: [Toleration(key="nvidia.com/gpu", effect="NoSchedule")]
    )
    """The plugin pods' tolerations (the Helm chart's `tolerations`): GPU nodes are often tainted."""
    priority_class_name: ObjectName = PLUGIN_PRIORITY_CLASS
    """The plugin pods' priority class (the Helm chart's `priorityClassName`)."""
    image_pull_secrets: list[ObjectName] = Field(default_factory=list)
    """Secrets in the plugin namespace to pull the image with (the Helm chart's `imagePullSecrets`)."""
    resources: PluginResources = PluginResources()
    """The plugin container's requests and limits (the Helm chart's `resources`)."""
    dcgm_exporter_image: ImageRef = DEFAULT_DCGM_EXPORTER_IMAGE
    """The image of the pinned dcgm-exporter (`nodes[].operands.dcgmExporter: pinned`); the pinned GPU Feature
    Discovery runs from `image`, which carries it. Both run in the plugin's namespace with its tolerations, priority
    class and pull secrets."""
    nvidia_driver_root: HostPath = "/"
    """With `cdi-cri`, and for the pinned DRA kubelet plugin of `allocator: dra` nodes: where the driver's files are on
    the host (the Helm charts' `nvidiaDriverRoot`), its `lib64`/`lib` and `bin` below it: `/` for a driver installed on
    the host, `/run/nvidia/driver` for the GPU Operator's driver container, `/usr/local/nvidia` where NVML is in
    `/usr/local/nvidia/lib64`."""
    nvidia_cdi_hook_path: HostPath | None = None
    """With `cdi-cri`: the host path of `nvidia-cdi-hook` (the Helm chart's `cdi.nvidiaHookPath`), e.g.
    `/usr/local/nvidia/toolkit/nvidia-cdi-hook` where the GPU Operator installs the toolkit."""
    volume_mounts_accepted_by: Annotated[ToolkitSettingsSource, LaxEnum] | None = None
    """Required with `volume-mounts`: who makes the toolkit read those mounts
    (`accept-nvidia-visible-devices-as-volume-mounts = true`). `clusterPolicy`: this stack's ClusterPolicy patch;
    `nodeConfig`: an admin, in each GPU node's `/etc/nvidia-container-runtime/config.toml`. Without it the toolkit
    ignores the mounts and GPU pods fail to start."""
