"""What a valid hidden-gpu stack is: its top-level keys (StackConfig) and the rules across them.

Every rule about the `hidden-gpu:` configuration lives in stack_config/ (this module, node_config, plugin_config,
guard_config and the value types of values), so that the Pulumi program, the offline render and the host tools
all accept and reject exactly the same stacks. Each key's `description` is its documentation: docs/configuration.md
is generated from these models.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StrictInt, model_validator

from common.names import (
    CLUSTER_NAMESPACES,
    DEFAULT_CLUSTER_POLICY,
    DEFAULT_DRA_PLUGIN_IMAGE,
    NVIDIA_DRA_DRIVER,
    Allocator,
    DeviceListStrategy,
    ToolkitSettingsSource,
)
from stack_config.errors import MISSING, Loc, key_path
from stack_config.guard_config import GuardConfig
from stack_config.node_config import NodeConfig
from stack_config.plugin_config import DevicePluginConfig
from stack_config.values import ImageRef, NamespaceName, ObjectName, StrictModel, as_given, raise_problems, short_loc


class ClusterPolicyConfig(StrictModel):
    """Opt-in patch of the GPU Operator's ClusterPolicy so the toolkit ignores the env var route."""

    patch: bool = False
    """Patch the ClusterPolicy's toolkit and device-plugin env (cluster-wide); needs `devicePlugin.deviceListStrategy:
    volume-mounts`."""
    name: ObjectName = DEFAULT_CLUSTER_POLICY
    """The ClusterPolicy's name."""


def _nvidia_driver(driver: str) -> str:
    if driver != NVIDIA_DRA_DRIVER:
        raise ValueError(
            f"must be {NVIDIA_DRA_DRIVER}: hidden-gpu pins NVIDIA's kubelet plugin (kubeletPluginImage), which "
            "publishes the GPUs under that name; delete this key"
        )
    return driver


class DraConfig(StrictModel):
    """DeviceClasses of the exposed GPUs, for clusters that allocate GPUs through Dynamic Resource Allocation."""

    driver: Annotated[ObjectName, AfterValidator(_nvidia_driver)] = NVIDIA_DRA_DRIVER
    """The DRA driver that publishes the GPUs: NVIDIA's, whose kubelet plugin hidden-gpu pins (`kubeletPluginImage`);
    each class selects only its devices whose `uuid` attribute is one of the exposed UUIDs there."""
    kubelet_plugin_image: ImageRef = DEFAULT_DRA_PLUGIN_IMAGE
    """The image of NVIDIA's DRA kubelet plugin (`gpu-kubelet-plugin`), which hidden-gpu runs on each DRA node pinned
    to its exposed GPUs, so that its ResourceSlice lists no hidden one; pinned by tag or digest, not `:latest`. It
    runs in the device plugin's namespace with its tolerations, priority class and pull secrets."""


class StackConfig(StrictModel):
    """The `hidden-gpu:` keys of one stack, without their prefix."""

    nodes: Annotated[list[NodeConfig], Field(min_length=1)]
    """The shared GPU nodes; at least one."""
    quotas: dict[NamespaceName, Annotated[StrictInt, Field(ge=0)]] = Field(default_factory=dict)
    """Namespace -> the most `nvidia.com/gpu` it may request (`requests.nvidia.com/gpu`), and the most devices of each
    of the stack's DRA classes it may claim: each counted apart (a quota caps one name at a time). The namespaces must
    exist."""
    device_plugin: DevicePluginConfig = DevicePluginConfig()
    """The pinned device plugins."""
    guard: GuardConfig = GuardConfig()
    """The access guard (admission policy)."""
    cluster_policy: ClusterPolicyConfig = ClusterPolicyConfig()
    """The opt-in ClusterPolicy patch."""
    dra: DraConfig | None = None
    """The DRA settings of the nodes with `allocator: dra` (absent: the defaults; present, at least one such node).
    Each pool, or node outside a pool, of those nodes that exposes GPUs gets a DeviceClass (`hidden-gpu-pool-<pool>`,
    `hidden-gpu-<node>`) selecting only its exposed GPUs; tenants may claim from them (ExactCount, no adminAccess,
    no tolerations) and `quotas` caps each class per namespace too."""

    rollout_wave: Annotated[StrictInt, Field(ge=0)] = 0
    """When `up` runs after a merge: stacks go in ascending waves, each only once the one before is up and
    verified (dev 0, prod 2: a new environment picks its place without touching the others). Read by
    `python -m offline.fleet --list`, which the up workflow runs; the program does not use it."""

    @property
    def dra_settings(self) -> DraConfig | None:
        """The DRA settings in force: the written ones, or the defaults where a node is allocated by DRA."""
        if self.dra is None and any(n.allocator == Allocator.DRA for n in self.nodes):
            return DraConfig()
        return self.dra

    @property
    def dra_classes(self) -> dict[str, list[str]]:
        """The stack's DeviceClasses and the exposed UUIDs each selects, in stack order: one per pool (or node outside
        a pool) of the nodes DRA allocates that expose GPUs, named like the RuntimeClasses. No plugin node's GPU is in
        one: each GPU has one allocator."""
        classes: dict[str, list[str]] = {}
        for node in self.nodes:
            if node.exposed_gpus and node.allocator == Allocator.DRA:
                classes.setdefault(node.class_name, []).extend(node.exposed_gpus)
        return classes

    @property
    def exempt_namespaces(self) -> list[str]:
        """The guard's exemptions (GuardConfig.exempt_with)."""
        return self.guard.exempt_with(self.device_plugin.namespace)

    @model_validator(mode="after")
    def _rules_across_fields(self) -> StackConfig:
        raise_problems(_stack_problems(self))
        return self


def _stack_problems(stack: StackConfig) -> Iterator[tuple[Loc, Any, str]]:
    """Rules that span several nodes or sections, each located by its full path."""
    yield from _toolkit_problems(stack)
    if stack.cluster_policy.patch and stack.device_plugin.device_list_strategy != DeviceListStrategy.VOLUME_MOUNTS:
        yield (
            ("clusterPolicy", "patch"),
            True,
            "needs devicePlugin.deviceListStrategy: volume-mounts: once the toolkit ignores "
            "NVIDIA_VISIBLE_DEVICES, a plugin using env vars hands out GPUs no pod receives",
        )
    plugin = stack.device_plugin
    if plugin.create_namespace and plugin.namespace in CLUSTER_NAMESPACES:
        yield (
            ("devicePlugin", "createNamespace"),
            True,
            f"namespace {plugin.namespace} belongs to the cluster or the GPU Operator: hidden-gpu must not "
            "create it (nor ever delete it); set createNamespace: false, or use a namespace of its own",
        )
    yield from _adoption_stack_problems(stack)
    yield from _allocator_problems(stack)
    first_node: dict[str, int] = {}
    first_place: dict[str, Loc] = {}
    for node_index, node in enumerate(stack.nodes):
        if node.name in first_node:
            yield ("nodes", node_index, "name"), node.name, f"node listed twice (also nodes[{first_node[node.name]}])"
        else:
            first_node[node.name] = node_index
        for place, uuid in node.places():
            here = ("nodes", node_index, *place)
            first = first_place.setdefault(uuid, here)
            if first != here and first[1] != node_index:
                yield here, uuid, f"GPU also listed on another node ({short_loc(first)}); a GPU belongs to one node"


def _allocator_problems(stack: StackConfig) -> Iterator[tuple[Loc, Any, str]]:
    """One allocator per exposed GPU: a pool's class lands a pod on any of its nodes, so they share one; and
    `hidden-gpu:dra` alone would make a class of GPUs the plugin already advertises (the old meaning), a GPU handed
    out twice."""
    first_in_pool: dict[str, int] = {}
    for index, node in enumerate(stack.nodes):
        if node.pool is None:
            continue
        first = first_in_pool.setdefault(node.pool, index)
        if stack.nodes[first].allocator != node.allocator:
            yield (
                ("nodes", index, "allocator"),
                str(node.allocator),
                f"pool {node.pool} is allocated by {stack.nodes[first].allocator} (nodes[{first}]): a pool's nodes "
                "share one allocator",
            )
    if stack.dra is not None and not any(n.allocator == Allocator.DRA for n in stack.nodes):
        yield (
            ("dra",),
            as_given(stack.dra),
            "no node has allocator: dra, so every exposed GPU is the device plugin's: a DeviceClass of the same "
            "GPUs would hand each out twice; set allocator: dra on the nodes DRA should serve, or delete this key",
        )


def _adoption_stack_problems(stack: StackConfig) -> Iterator[tuple[Loc, Any, str]]:
    """An adopted plugin stays in its namespace, which the guard must exempt (its pods mount a host directory);
    a hand-made DaemonSet taken over is one node's plugin; one of several nodes is named shared by each."""
    first: dict[tuple[str, str], tuple[int, bool]] = {}
    for node_index, node in enumerate(stack.nodes):
        adopt = node.adopt_device_plugin
        if adopt is None:
            continue
        if adopt.namespace not in stack.exempt_namespaces:
            yield (
                ("nodes", node_index, "adoptDevicePlugin", "namespace"),
                adopt.namespace,
                "not exempt from the guard, which would refuse the plugin's pods (a host directory): add it to "
                "guard.exemptNamespaces",
            )
        key = (adopt.namespace, adopt.name)
        earlier = first.setdefault(key, (node_index, adopt.shared))
        if earlier[0] != node_index and not (adopt.shared and earlier[1]):
            yield (
                ("nodes", node_index, "adoptDevicePlugin", "name"),
                adopt.name,
                f"also adopted by nodes[{earlier[0]}]: a DaemonSet taken over is one node's plugin; where it serves "
                "several nodes, say shared: true on each",
            )


def _toolkit_problems(stack: StackConfig) -> Iterator[tuple[Loc, Any, str]]:
    """volume-mounts needs a toolkit that reads the mounts, and the stack must say who sets that;
    cdi-cri needs to know where the driver is."""
    plugin = stack.device_plugin
    cdi = plugin.device_list_strategy == DeviceListStrategy.CDI_CRI
    # The pinned DRA kubelet plugin reads NVML and nvidia-smi under the driver root too (desired/dra_plugin.py).
    dra = any(n.allocator == Allocator.DRA for n in stack.nodes)
    for key, field, means in (
        ("nvidiaDriverRoot", "nvidia_driver_root", "deviceListStrategy cdi-cri or a node with allocator: dra"),
        ("nvidiaCdiHookPath", "nvidia_cdi_hook_path", "deviceListStrategy cdi-cri"),
    ):
        if field in plugin.model_fields_set and not (cdi or (dra and field == "nvidia_driver_root")):
            yield ("devicePlugin", key), getattr(plugin, field), f"only means something with {means}"
    source = plugin.volume_mounts_accepted_by
    if plugin.device_list_strategy == DeviceListStrategy.VOLUME_MOUNTS and source is None:
        yield (
            ("devicePlugin", "volumeMountsAcceptedBy"),
            MISSING,
            "required with deviceListStrategy volume-mounts: clusterPolicy (this stack patches the "
            "ClusterPolicy) or nodeConfig (an admin set accept-nvidia-visible-devices-as-volume-mounts on "
            "every GPU node); without that setting the toolkit ignores the mounts and GPU pods fail",
        )
    if source == ToolkitSettingsSource.CLUSTER_POLICY and not stack.cluster_policy.patch:
        yield (
            ("devicePlugin", "volumeMountsAcceptedBy"),
            str(source),
            "says the ClusterPolicy patch provides the setting, but clusterPolicy.patch is false",
        )
    if source is not None and plugin.device_list_strategy != DeviceListStrategy.VOLUME_MOUNTS:
        yield (
            ("devicePlugin", "volumeMountsAcceptedBy"),
            str(source),
            "only means something with deviceListStrategy volume-mounts",
        )


def quota_warnings(stack: StackConfig) -> list[str]:
    """Quotas above what this stack's nodes can ever advertise: not wrong (the cluster may have
    other GPU nodes), but often a forgotten time-slicing or a typo."""
    advertised = sum(node.advertised_gpus for node in stack.nodes)
    # A quota caps nvidia.com/gpu and each DRA class apart: the most any one of them hands out.
    per_class = {name: len(uuids) for name, uuids in stack.dra_classes.items()}
    most = max(advertised, *per_class.values()) if per_class else advertised
    what = (
        f"{advertised} nvidia.com/gpu this stack's nodes advertise"
        if not per_class
        else f"{most} GPUs any one allocator of this stack hands out ({advertised} nvidia.com/gpu, its DeviceClasses "
        f"{', '.join(map(str, per_class.values()))})"
    )
    return [
        f"{key_path(('quotas', namespace))} = {limit}: more than the {what}"
        for namespace, limit in sorted(stack.quotas.items())
        if limit > most
    ]


def device_class_warnings(stack: StackConfig) -> list[str]:
    """Classes tenants may claim from whose selectors a render cannot read: where the stack hides GPUs, each one may
    select them. `cluster.verify` evaluates the live class against the nodes' ResourceSlices."""
    if not any(node.hidden_gpus for node in stack.nodes):
        return []
    return [
        f"{key_path(('guard', 'allowedDeviceClasses', index))} = {name}: tenants may claim every device this class "
        "selects and the render cannot read its selector; `cluster.verify` fails if it selects a hidden GPU (a "
        "device whose `uuid` attribute is one)"
        for index, name in enumerate(stack.guard.allowed_device_classes)
    ]
