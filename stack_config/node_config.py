"""One shared GPU node of a stack (`hidden-gpu:nodes[]`): its GPUs, operands, MIG layout, pool, adoption and
allocator, and the rules within one node."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictInt, model_validator

from common.names import (
    POOL_CLASS_INFIX,
    Allocator,
    MigStrategy,
    OperandMode,
    Role,
    plugin_labels,
    pool_class_name,
    runtime_class_name,
)
from stack_config.errors import MISSING, Loc
from stack_config.values import (
    ContainerName,
    DeviceUuid,
    GpuUuid,
    LabelKey,
    LabelValue,
    LaxEnum,
    MigUuid,
    NamespaceName,
    NodeName,
    ObjectName,
    PoolName,
    StrictModel,
    as_given,
    raise_problems,
    short_loc,
)


def _operand_switch(value: object) -> object:
    # `false` was the only value before `pinned`: it keeps its meaning. `true` ran the operator's own.
    if value is False:
        return OperandMode.OFF
    if value is True:
        raise ValueError(
            "the GPU Operator's own reads every GPU of the node, the hidden ones too: "
            "`pinned` runs one that sees only the exposed GPUs, or `false`"
        )
    return value


# A GPU-reading operand: `pinned` or `false` (`off`).
OperandSwitch = Annotated[OperandMode, LaxEnum, BeforeValidator(_operand_switch)]


class OperandsConfig(StrictModel):
    """Which other GPU Operator operands still run on the node (`nvidia.com/gpu.deploy.<operand>`)."""

    gpu_feature_discovery: OperandSwitch = OperandMode.OFF
    """`pinned`: hidden-gpu runs GPU Feature Discovery here, pinned to the exposed GPUs as the plugin is: its labels
    (`nvidia.com/gpu.count`, `.product`, `.memory`) count and name only those. `false` (`off`): no GPU labels. `true`,
    the operator's own, is refused: it labels every GPU of the node, the hidden ones too, and runs privileged."""
    mig_manager: bool = False
    """Run the MIG manager here. Off: it applies MIG profiles to every GPU, the other organisation's too."""
    dcgm: bool = False
    """Run the operator's standalone DCGM host engine here. Off: it serves every GPU of the node, unauthenticated, to
    any pod on the node (a node-local Service on port 5555); dcgm-exporter then embeds its own."""
    dcgm_exporter: OperandSwitch | None = None
    """`pinned`: hidden-gpu runs dcgm-exporter here, pinned to the exposed GPUs: no series of a hidden GPU. `false`
    (`off`): none. Default: `pinned` where some GPU is exposed (without MIG), `false` elsewhere. `true`, the
    operator's own, is refused: it reads every GPU of the node."""
    operator_validator: bool | None = None
    """Run the operator's validator here. Default: off where the node advertises no `nvidia.com/gpu` (every GPU hidden,
    or `allocator: dra`: its plugin validation waits for that resource, so it would never turn Ready), on elsewhere."""
    container_toolkit: bool | None = None
    """Run the operator's container toolkit here, which installs the `nvidia` runtime handler. Default: off where every
    GPU is hidden, so no pod on the node can run under NVIDIA's runtime at all; it must stay on where a GPU is
    exposed (the pinned plugin and GPU pods run under it)."""


class TimeSlicingConfig(StrictModel):
    """The plugin's time-slicing: each exposed GPU is advertised `replicas` times."""

    replicas: Annotated[StrictInt, Field(ge=2)]
    """At least 2: how many times each exposed GPU is advertised."""
    rename_by_default: bool = False
    """Advertise `nvidia.com/gpu.shared` instead of `nvidia.com/gpu`."""
    fail_requests_greater_than_one: bool = False
    """Refuse pods that ask for more than one replica."""


class AdoptedPluginConfig(StrictModel):
    """A plugin DaemonSet made by hand (the recipe run without hidden-gpu) that this node's plugin replaces: two
    plugins of one resource on a node leave the kubelet with no healthy GPU (docs/operations.md, "Adopting a
    hand-made setup"). One node's own is taken over (`up` applies the node's plugin under its name); one that serves
    several nodes (`shared: true`) is left to serve the others, and leaves this node by the node label hidden-gpu
    sets."""

    namespace: NamespaceName
    """The hand-made DaemonSet's namespace: it stays there (a DaemonSet cannot move), so it must be exempt from the
    guard (`guard.exemptNamespaces`, or `devicePlugin.namespace` itself)."""
    name: ObjectName
    """The hand-made DaemonSet's name: it keeps it."""
    match_labels: Annotated[dict[LabelKey, LabelValue], Field(min_length=1)] | None = None
    """Its `spec.selector.matchLabels`, exactly (`kubectl get ds -o jsonpath='{.spec.selector.matchLabels}'`): a
    DaemonSet's selector cannot change, so the taken-over one keeps it and its pods carry these labels too. Required
    unless `shared`."""
    container: ContainerName | None = None
    """The name of its plugin container: the taken-over container keeps it (server-side apply merges containers by
    name; another name would add a second plugin container beside it). Required unless `shared`."""
    shared: bool = False
    """The DaemonSet serves several nodes (by GPU index, say): it is not taken over. It must carry the node-affinity
    expression `hidden-gpu.io/node DoesNotExist` in every term, so that the node label moves it off this node; this
    node's own plugin starts only once no other NVIDIA plugin socket is left on the node."""

    @property
    def taken_over(self) -> AdoptedPluginConfig | None:
        """Itself where `up` applies the node's plugin under it (not shared); a shared one keeps its own objects."""
        return None if self.shared else self


class NodeConfig(StrictModel):
    """One shared GPU node: which of its GPUs Kubernetes may schedule."""

    name: NodeName
    """The Kubernetes node name (DNS-1123, at most 63 characters: it is also a label value); each node once."""
    exposed_gpus: list[DeviceUuid]
    """UUIDs Kubernetes may schedule (`GPU-...`, or `MIG-...` with a MIG strategy); may be empty: every GPU hidden."""
    hidden_gpus: list[DeviceUuid] = Field(default_factory=list)
    """UUIDs kept from Kubernetes; listed so reviewers and `discover --check` see every GPU accounted for."""
    operands: OperandsConfig = OperandsConfig()
    """Per-node switches of the GPU Operator's other operands."""
    time_slicing: TimeSlicingConfig | None = None
    """Time-slice the exposed GPUs (the pinned plugin sees no other)."""
    mig_strategy: Annotated[MigStrategy, LaxEnum] = MigStrategy.NONE
    """The plugin's `MIG_STRATEGY`: `none`, `single` or `mixed`."""
    pool: PoolName | None = None
    """A pool of interchangeable shared nodes: the pool's one RuntimeClass (`hidden-gpu-pool-<pool>`) lands a pod on
    any of them, instead of this node's own class."""
    mig_devices: dict[GpuUuid, list[MigUuid]] = Field(default_factory=dict)
    """The node's MIG layout, parent GPU UUID -> its MIG device UUIDs: needed for every listed MIG UUID (`discover
    --expose` writes it)."""
    adopt_device_plugin: AdoptedPluginConfig | None = None
    """A hand-made plugin DaemonSet this node's plugin replaces: taken over, keeping its name, namespace, selector
    and container name, or (`shared`) left to the other nodes it serves; only on a node that exposes GPUs."""
    allocator: Annotated[Allocator, LaxEnum] = Allocator.DEVICE_PLUGIN
    """Who hands the exposed GPUs to pods, exactly one: `devicePlugin` (the pinned plugin, as `nvidia.com/gpu`) or
    `dra` (the stack's DeviceClass of the node or its pool, through NVIDIA's DRA driver; no plugin runs). The nodes
    of a pool share one."""

    @property
    def roles(self) -> dict[str, Role]:
        """Every GPU or MIG device the node lists, and which side it is on."""
        return {uuid: Role.EXPOSED for uuid in self.exposed_gpus} | {uuid: Role.HIDDEN for uuid in self.hidden_gpus}

    @property
    def taken_over_plugin(self) -> AdoptedPluginConfig | None:
        """The hand-made DaemonSet `up` applies this node's plugin under: one adopted and not shared."""
        return None if self.adopt_device_plugin is None else self.adopt_device_plugin.taken_over

    @property
    def shared_plugin(self) -> AdoptedPluginConfig | None:
        """The hand-made DaemonSet of several nodes this node's plugin replaces, left in place."""
        adopt = self.adopt_device_plugin
        return adopt if adopt is not None and adopt.shared else None

    @property
    def replicas(self) -> int:
        return self.time_slicing.replicas if self.time_slicing else 1

    @property
    def class_name(self) -> str:
        """The node's RuntimeClass and, where DRA allocates it, its DeviceClass: its pool's, else its own."""
        return pool_class_name(self.pool) if self.pool else runtime_class_name(self.name)

    @property
    def runs_plugin(self) -> bool:
        """Whether the node gets a pinned device plugin: it exposes GPUs, and the plugin hands them out."""
        return bool(self.exposed_gpus) and self.allocator == Allocator.DEVICE_PLUGIN

    @property
    def advertised_gpus(self) -> int:
        """How many `nvidia.com/gpu` the node's plugin advertises (none where DRA hands the GPUs out). Under the
        mixed strategy MIG devices are advertised as `nvidia.com/mig-<profile>` instead."""
        if self.allocator == Allocator.DRA:
            return 0
        counted = [
            u for u in self.exposed_gpus if not (self.mig_strategy == MigStrategy.MIXED and u.startswith("MIG-"))
        ]
        return len(counted) * self.replicas

    def places(self) -> Iterator[tuple[Loc, str]]:
        """Every listed UUID with its place, relative to the node: (("exposedGpus", 0), uuid)."""
        for field, uuids in (("exposedGpus", self.exposed_gpus), ("hiddenGpus", self.hidden_gpus)):
            for index, uuid in enumerate(uuids):
                yield (field, index), uuid

    @model_validator(mode="after")
    def _rules_across_fields(self) -> NodeConfig:
        raise_problems(_node_problems(self))
        return self


def _node_problems(node: NodeConfig) -> Iterator[tuple[Loc, Any, str]]:
    """Rules within one node: each UUID once, and the MIG rules. Paths relative to the node."""
    if node.name.startswith(POOL_CLASS_INFIX):
        yield (
            ("name",),
            node.name,
            f"node names starting with {POOL_CLASS_INFIX!r} would collide with pool RuntimeClasses",
        )
    yield from _operand_problems(node)
    if node.exposed_gpus and node.operands.container_toolkit is False:
        yield (
            ("operands", "containerToolkit"),
            False,
            "the node exposes GPUs: its pinned plugin and GPU pods run under the toolkit's nvidia runtime",
        )
    yield from _adoption_problems(node)
    yield from _dra_node_problems(node)
    first_place: dict[str, Loc] = {}
    yield from _duplicates(node, first_place)
    yield from _mig_problems(node, first_place)


def _operand_problems(node: NodeConfig) -> Iterator[tuple[Loc, Any, str]]:
    """A pinned GFD or dcgm-exporter reads the GPUs its container is given: it needs one and, for now, whole GPUs
    (the operator's own, which reads every GPU, is refused as it is read: _operand_switch)."""
    for field, value in (
        ("gpuFeatureDiscovery", node.operands.gpu_feature_discovery),
        ("dcgmExporter", node.operands.dcgm_exporter),
    ):
        loc = ("operands", field)
        if value == OperandMode.PINNED and not node.exposed_gpus:
            yield loc, value, "the node exposes no GPU, so a pinned one would read none: set `false`"
        elif value == OperandMode.PINNED and node.mig_strategy != MigStrategy.NONE:
            yield (
                loc,
                value,
                (
                    "not with a MIG strategy yet: reading MIG devices takes the MIG monitor capability (SYS_ADMIN), "
                    "which hidden-gpu gives only its plugin; set `false`"
                ),
            )


def _dra_node_problems(node: NodeConfig) -> Iterator[tuple[Loc, Any, str]]:
    """Settings of the device plugin mean nothing where DRA hands the GPUs out; said, not silently dropped."""
    if node.allocator != Allocator.DRA:
        return
    if node.adopt_device_plugin is not None:
        reason = "a hand-made plugin would hand the GPUs out beside DRA; delete it, or keep allocator: devicePlugin"
        yield ("adoptDevicePlugin",), as_given(node.adopt_device_plugin), f"not with allocator: dra: {reason}"
    if node.time_slicing is not None:
        reason = "time-slicing is the device plugin's; hidden-gpu shares no GPU through DRA yet"
        yield ("timeSlicing",), as_given(node.time_slicing), f"not with allocator: dra: {reason}"
    if node.mig_strategy != MigStrategy.NONE:
        reason = "hidden-gpu offers no MIG device through DRA yet; set migStrategy: none"
        yield ("migStrategy",), str(node.mig_strategy), f"not with allocator: dra: {reason}"


def _adoption_problems(node: NodeConfig) -> Iterator[tuple[Loc, Any, str]]:
    adopt = node.adopt_device_plugin
    if adopt is None:
        return
    if not node.exposed_gpus:
        yield (
            ("adoptDevicePlugin",),
            adopt.name,
            "the node exposes no GPU, so it runs no plugin to adopt: delete the hand-made DaemonSet instead",
        )
    written = {"matchLabels": adopt.match_labels, "container": adopt.container}
    for key, value in written.items():
        if adopt.shared and value is not None:
            yield (
                ("adoptDevicePlugin", key),
                value,
                "not with shared: true: a DaemonSet of several nodes is not taken over, so it keeps its own; delete "
                "this key",
            )
        if not adopt.shared and value is None:
            yield (
                ("adoptDevicePlugin", key),
                MISSING,
                "required: the taken-over DaemonSet keeps it (or set shared: true where the DaemonSet serves other "
                "nodes too)",
            )
    for key, value in (adopt.match_labels or {}).items():
        ours = plugin_labels(node.name).get(key)
        if ours is not None and ours != value:
            yield (
                ("adoptDevicePlugin", "matchLabels", key),
                value,
                f"hidden-gpu labels its plugin pods {key}={ours}: the selector would no longer match them",
            )


def _duplicates(node: NodeConfig, first_place: dict[str, Loc]) -> Iterator[tuple[Loc, Any, str]]:
    """Each UUID once on the node; fills first_place with where each was first listed."""
    for place, uuid in node.places():
        first = first_place.setdefault(uuid, place)
        if first == place:
            continue
        if first[0] != place[0]:
            yield place, uuid, f"GPU is both exposed and hidden (also at {short_loc(first)}); choose one"
        else:
            yield place, uuid, f"GPU listed twice on this node (also at {short_loc(first)})"


def _mig_problems(node: NodeConfig, first_place: dict[str, Loc]) -> Iterator[tuple[Loc, Any, str]]:
    if node.time_slicing and node.mig_strategy == MigStrategy.MIXED:
        yield (
            ("timeSlicing",),
            node.time_slicing.model_dump(by_alias=True),
            "time-slicing here shares nvidia.com/gpu; with migStrategy mixed MIG devices are "
            "advertised per profile instead: use migStrategy single, or no time-slicing",
        )
    parent_of: dict[str, str] = {}
    for parent, devices in node.mig_devices.items():
        for index, mig in enumerate(devices):
            if mig in parent_of:
                yield ("migDevices", parent, index), mig, f"also listed under {parent_of[mig]}"
            else:
                parent_of[mig] = parent
    for uuid, place in first_place.items():
        if not uuid.startswith("MIG-"):
            continue
        if node.mig_strategy == MigStrategy.NONE:
            yield place, uuid, "a MIG device needs migStrategy single or mixed on this node"
        elif uuid not in parent_of:
            yield (
                place,
                uuid,
                "parent GPU unknown: list the node's MIG layout under migDevices "
                "(python -m host.discover --expose writes it)",
            )
    side_of = node.roles
    for parent, devices in node.mig_devices.items():
        listed = [uuid for uuid in (parent, *devices) if uuid in side_of]
        exposed = [uuid for uuid in listed if side_of[uuid] == Role.EXPOSED]
        hidden = [uuid for uuid in listed if side_of[uuid] == Role.HIDDEN]
        if exposed and hidden:
            yield (
                first_place[exposed[0]],
                exposed[0],
                f"exposed, but {hidden[0]} of the same GPU ({parent}) is hidden: a plugin that can see "
                "one MIG device of a GPU monitors all of them (NVIDIA_MIG_MONITOR_DEVICES=all); "
                "keep a GPU and all its MIG devices on one side",
            )
