"""HiddenGpuNode: one shared GPU node on which Kubernetes sees only the exposed GPUs."""

# No `from __future__ import annotations`: Pulumi's analyzer (package/) reads the annotations as types.
import typing
from collections.abc import Mapping
from typing import NamedTuple, NotRequired, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from common.names import (
    DEFAULT_DRA_PLUGIN_IMAGE,
    FIELD_MANAGER,
    FIELD_MANAGER_ANNOTATION,
    NODE_OUTPUT_KEYS,
    NVIDIA_RUNTIME_HANDLER,
    OPERANDS_OFF_ANNOTATION,
    PATCH_FORCE_ANNOTATION,
    Allocator,
    MigStrategy,
)
from common.tokens import Token
from components.dra_plugin import DraPluginObjects
from components.inputs import as_args, derive, is_plain, validated_input
from components.pinned_operands import pinned_operand
from components.stack_types import DevicePluginSpec, NodeSpec
from desired.device_plugin import config_data, config_map_metadata, plugin_metadata, plugin_name, plugin_spec
from desired.node_labels import node_labels, operands_off, pinned_operands, planned_operands
from desired.pods import node_class_metadata, node_class_scheduling
from stack_config.errors import MISSING_KEY, ConfigError, InvalidInputError, as_written, unknown_key, validated
from stack_config.models import DraConfig
from stack_config.node_config import AdoptedPluginConfig, NodeConfig, OperandsConfig
from stack_config.plugin_config import DevicePluginConfig
from stack_config.values import ImageRef, NodeName

EMPTY_OUTPUT = (
    "an Output that turned out empty: the plugin was declared before it was known (whether a node runs one decides "
    "which objects it gets); a node that hides every GPU says so with a plain empty list"
)
PLAIN_ONLY = "must be a plain value, not an Output: it decides which objects the node gets"
NOT_A_MAPPING = "must be a plain mapping, not an Output: its name and UUIDs may be Outputs, its other keys may not"


class HiddenGpuNodeArgs(TypedDict):
    """What one shared GPU node needs. A TypedDict: what Pulumi's component provider hands the component."""

    node: NodeSpec
    """The node's stack entry, as the stack file writes it: its name, exposed and hidden UUIDs, sharing and
    operand switches. A plain mapping, whose `name`, `exposedGpus` and `hiddenGpus` may be Outputs (a
    StackReference's, another resource's): validated by the stack models once known, and where a preview does
    not know the UUIDs, so are the fields they fill. The name must be known at preview time (plain, or an Output
    a preview knows, such as a StackReference's; not one of a resource being created): it is the label patch's
    `metadata.name`, which the Kubernetes provider's check requires in a preview too, and names the other
    objects. The other keys (`migDevices`, `timeSlicing`, `operands`, ...) must be plain: they decide which
    objects the node gets (a plugin, its config), and a preview must know which. Plain too is whether
    `exposedGpus` is empty: a node whose list is an Output runs a plugin, and the list must turn out non-empty."""
    device_plugin: DevicePluginSpec
    """The stack's `devicePlugin` settings (image, namespace, device-list strategy), as the stack file writes them."""
    plugin_namespace: pulumi.Input[str]
    """The namespace the plugin runs in: an Output of the PluginNamespace, so the plugin waits for it."""
    pool_class: NotRequired[pulumi.Input[str]]
    """The RuntimeClass of the node's pool (GpuPool), which then replaces the node's own."""
    dra_plugin_image: NotRequired[str]
    """The image of NVIDIA's DRA kubelet plugin (the stack's `dra.kubeletPluginImage`), run pinned to the exposed
    GPUs where the node's `allocator` is `dra`; its default where not given."""


Node = NodeConfig | pulumi.Output[NodeConfig]
"""A node's entry validated: at once where every value is plain (the program's own path), else once its Outputs are
known."""


class _Identity(NamedTuple):
    """What names the node's objects: plain where the node's name is, and known in a preview wherever the name is,
    whatever its UUIDs (the label patch needs its `metadata.name` then)."""

    name: str | pulumi.Output[str]
    adopt: AdoptedPluginConfig | None


def _spec(spec: object) -> NodeSpec:
    """The node's entry, where its shape is plain: a mapping, of known keys, Outputs only where NODE_OUTPUT_KEYS."""
    if not isinstance(spec, Mapping):
        raise InvalidInputError.of([ConfigError(("node",), NOT_A_MAPPING)])
    if is_plain(spec):
        return typing.cast(NodeSpec, spec)  # judged whole by the model, every problem at once
    keys = [field.alias for field in NodeConfig.model_fields.values() if field.alias]
    problems = [
        # Before the plain-only check: a misspelt key is that, whatever its value.
        ConfigError(("node", k), unknown_key(k, keys), *([v] if is_plain(v) else []))
        for k, v in spec.items()
        if k not in keys
    ] + [
        ConfigError(("node", k), PLAIN_ONLY)
        for k, v in spec.items()
        if k in keys and k not in NODE_OUTPUT_KEYS and not is_plain(v)
    ]
    if problems:
        raise InvalidInputError.of(problems)
    return typing.cast(NodeSpec, spec)


def _exposes(spec: NodeSpec) -> bool:
    """Whether the node exposes GPUs (a RuntimeClass, pinned operands): decided before any Output is known, as a
    preview must list the objects."""
    exposed = spec.get("exposedGpus")
    return not isinstance(exposed, list | tuple) or len(exposed) > 0


def _runs_plugin(spec: NodeSpec) -> bool:
    """Whether the node gets a plugin: it exposes GPUs and the plugin hands them out (`allocator` is plain: _spec)."""
    return _exposes(spec) and spec.get("allocator", Allocator.DEVICE_PLUGIN) == Allocator.DEVICE_PLUGIN


def _planned_operands(spec: NodeSpec, node: Node) -> list[str]:
    """The pinned operands the node gets: decided before any Output is known, from keys that must be plain (_spec)."""
    if isinstance(node, NodeConfig):
        return pinned_operands(node)
    operands = validated(OperandsConfig, spec.get("operands") or {}, ("node", "operands"))
    mig = validated(MigStrategy, spec.get("migStrategy", MigStrategy.NONE), ("node", "migStrategy"))
    return planned_operands(operands, exposes=_exposes(spec), mig=mig)


def _identity(component: str, spec: NodeSpec, node: Node) -> _Identity:
    """The node's name validated on its own, so a preview that knows it but not the UUIDs still declares it."""
    if isinstance(node, NodeConfig):
        return _Identity(node.name, node.taken_over_plugin)
    if "name" not in spec:
        raise InvalidInputError.of([ConfigError(("node", "name"), MISSING_KEY)])
    # The other keys are plain (_spec): what the whole node's model would say of them, it says at once here.
    written = spec.get("adoptDevicePlugin")
    adopt = (
        None if written is None else validated(AdoptedPluginConfig, written, ("node", "adoptDevicePlugin")).taken_over
    )
    return _Identity(validated_input(NodeName, spec["name"], ("node", "name"), f"HiddenGpuNode {component}"), adopt)


def _node(component: str, spec: NodeSpec, exposes: bool) -> Node:
    def plugin_has_gpus(known: NodeConfig) -> list[ConfigError]:
        return [ConfigError(("node", "exposedGpus"), EMPTY_OUTPUT, [])] if exposes and not known.exposed_gpus else []

    node: Node = validated_input(NodeConfig, spec, ("node",), f"HiddenGpuNode {component}", plugin_has_gpus)
    return node


def node_args(
    node: NodeConfig,
    plugin: DevicePluginConfig,
    plugin_namespace: pulumi.Input[str],
    pool_class: pulumi.Input[str] | None,
    dra: DraConfig | None = None,
) -> HiddenGpuNodeArgs:
    """The args for a node of a validated stack: its models written back as the stack file's keys."""
    args = HiddenGpuNodeArgs(
        node=typing.cast(NodeSpec, as_written(node)),
        device_plugin=typing.cast(DevicePluginSpec, as_written(plugin)),
        plugin_namespace=plugin_namespace,
    )
    if pool_class is not None:
        args["pool_class"] = pool_class
    if dra is not None and node.allocator == Allocator.DRA:
        args["dra_plugin_image"] = dra.kubelet_plugin_image
    return args


class NodeSummary(TypedDict):
    """What the stack exports per node."""

    exposedUuids: list[str]
    """The UUIDs the node's plugin serves."""
    exposedCount: int
    """How many GPUs the node exposes."""
    advertisedCount: int
    """How many `nvidia.com/gpu` the plugin advertises (time-slicing multiplies the exposed count)."""
    hiddenCount: int
    """How many GPUs the stack lists as hidden on the node."""
    devicePlugin: str | None
    """The plugin DaemonSet's name; none where every GPU is hidden or DRA hands the GPUs out."""
    runtimeClass: str | None
    """The RuntimeClass that lands a pod on the node (its pool's, where it has one); none where every GPU is hidden."""


class HiddenGpuNode(pulumi.ComponentResource):
    """Stops the GPU Operator's all-GPU device plugin on one node and runs a plugin pinned to
    the exposed GPUs instead. A node with no exposed GPU gets only the label patch.

    The node's name and UUIDs may be Outputs (HiddenGpuNodeArgs.node), the name one a preview knows (the label
    patch's `metadata.name`: a StackReference's, not a resource's being created); the children are named off the
    component's own `name`, which a resource name needs plain, and the program names it after the node."""

    label_patch: k8s.core.v1.NodePatch
    """The operator's per-node switches: its device plugin off, other operands as configured."""
    runtime_class: k8s.node.v1.RuntimeClass | None
    """The node's RuntimeClass (handler nvidia, scheduled onto this node); None without exposed GPUs."""
    plugin_config: k8s.core.v1.ConfigMap | None
    """The plugin's config file, where the node time-slices."""
    device_plugin: k8s.apps.v1.DaemonSet | None
    """The pinned, unprivileged device plugin; None without exposed GPUs."""
    dra_plugin: DraPluginObjects | None
    """NVIDIA's DRA kubelet plugin pinned to the exposed GPUs, and its identity; where DRA hands them out."""
    operands: dict[str, k8s.apps.v1.DaemonSet]
    """The GPU-reading operands hidden-gpu runs here pinned to the exposed GPUs (`gpu-feature-discovery`,
    `dcgm-exporter`), by name: those the node's `operands` set `pinned`."""
    summary: pulumi.Output[NodeSummary]
    """The node's exported summary (exposed UUIDs, counts, object names): known in a preview where the node's values
    are."""

    def __init__(self, name: str, args: HiddenGpuNodeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(Token.HIDDEN_GPU_NODE, name, None, opts)
        spec = _spec(args["node"])
        exposes = _exposes(spec)
        node = _node(name, spec, exposes)
        identity = _identity(name, spec, node)
        plugin = validated(DevicePluginConfig, args["device_plugin"], ("devicePlugin",))
        pool_class = args.get("pool_class")
        child = pulumi.ResourceOptions(parent=self)

        self.label_patch = k8s.core.v1.NodePatch(
            # Children are named off the component's name (the program names it after the node).
            f"{name}-operator-labels",
            # The name on its own, known in a preview that knows it (the provider's check refuses a patch without
            # one, in a preview too); the labels from the validated node, so an `up` patches nothing before the
            # whole node is judged.
            metadata=k8s.meta.v1.ObjectMetaPatchArgs(
                name=identity.name,
                labels=derive(node, node_labels),
                # The GPU Operator labels GPU nodes `...device-plugin=true` itself; without
                # force, server-side apply would refuse to take that field over.
                # The record of the switches this patch holds off, in the same write as the switches: the guard's
                # node-switches policy keeps them off against every other writer (the operator's operands toggle).
                annotations={
                    PATCH_FORCE_ANNOTATION: "true",
                    FIELD_MANAGER_ANNOTATION: FIELD_MANAGER,
                    OPERANDS_OFF_ANNOTATION: derive(node, operands_off),
                },
            ),
            # Fail closed: a node that leaves the stack (or a typo that renames it, or `pulumi
            # destroy`) keeps its labels and stays hidden. Deleting the patch would remove them,
            # and the operator's all-GPU plugin would return. Giving a node back is
            # `python -m cluster.release`, on purpose.
            # The switch waits for what the component was told to depend on: the program passes the access guard,
            # so no node is hidden (its operator plugin gone, tenant routes open) before the guard exists.
            opts=pulumi.ResourceOptions(
                parent=self, retain_on_delete=True, depends_on=opts.depends_on if opts is not None else None
            ),
        )

        self.runtime_class = None
        self.plugin_config = None
        self.device_plugin = None
        self.dra_plugin = None
        self.operands = {}
        if exposes:
            runtime_class: pulumi.Input[str]
            if pool_class is not None:
                runtime_class = pool_class
            else:
                self.runtime_class = _runtime_class(name, identity, node, child)
                runtime_class = self.runtime_class.metadata.name
            # The operator's plugin must be gone before ours registers the same kubelet socket; on
            # destroy Pulumi deletes ours first, then restores the label. The config, where there
            # is one, must exist before the plugin's pods mount it.
            needs: list[pulumi.Resource] = [self.label_patch]
            # Where DRA hands the GPUs out, no plugin: one allocator per GPU (NodeConfig.allocator).
            if _runs_plugin(spec):
                # Plain, like everything that decides which objects exist (HiddenGpuNodeArgs.node).
                if spec.get("timeSlicing") is not None:
                    self.plugin_config = _config_map(name, identity, node, args["plugin_namespace"], child)
                    needs.append(self.plugin_config)
                self.device_plugin = _device_plugin(
                    name,
                    identity,
                    node,
                    plugin,
                    plugin_namespace=args["plugin_namespace"],
                    runtime_class=runtime_class,
                    # Replacing the plugin (an adoption given up, a namespace changed) deletes the old one first:
                    # two plugins of one resource on a node leave the kubelet with no healthy GPU until one registers
                    # again (kubelet v1.36 devicemanager/plugin/v1beta1/handler.go runClient disconnects by name).
                    opts=pulumi.ResourceOptions(parent=self, depends_on=needs, delete_before_replace=True),
                )
            else:
                # NVIDIA's DRA kubelet plugin, pinned as the device plugin is: no hidden GPU in its ResourceSlice.
                self.dra_plugin = DraPluginObjects(
                    name,
                    identity.name,
                    node,
                    plugin,
                    validated(ImageRef, args.get("dra_plugin_image", DEFAULT_DRA_PLUGIN_IMAGE), ("dra_plugin_image",)),
                    namespace=args["plugin_namespace"],
                    runtime_class=runtime_class,
                    opts=pulumi.ResourceOptions(parent=self, depends_on=needs),
                )
            # After the switch that takes the operator's own off the node: its GFD writes the same features file.
            self.operands = {
                operand: pinned_operand(
                    name,
                    operand,
                    identity.name,
                    node,
                    plugin,
                    namespace=args["plugin_namespace"],
                    runtime_class=runtime_class,
                    opts=pulumi.ResourceOptions(parent=self, depends_on=needs),
                )
                for operand in _planned_operands(spec, node)
            }

        self.summary = pulumi.Output.from_input(derive(node, _summary))
        self.register_outputs({"summary": self.summary})


def _summary(node: NodeConfig) -> NodeSummary:
    return NodeSummary(
        exposedUuids=list(node.exposed_gpus),
        exposedCount=len(node.exposed_gpus),
        advertisedCount=node.advertised_gpus,
        hiddenCount=len(node.hidden_gpus),
        devicePlugin=plugin_name(node.name, node.taken_over_plugin) if node.runs_plugin else None,
        runtimeClass=node.class_name if node.exposed_gpus else None,
    )


def _runtime_class(
    prefix: str, identity: _Identity, node: Node, opts: pulumi.ResourceOptions
) -> k8s.node.v1.RuntimeClass:
    # Metadata from the name alone (a preview that knows it names the object, rather than the provider auto-naming
    # it); the scheduling from the validated node, so an `up` declares nothing before the whole node is judged.
    return k8s.node.v1.RuntimeClass(
        f"{prefix}-runtime-class",
        metadata=as_args(derive(identity.name, node_class_metadata)),
        handler=NVIDIA_RUNTIME_HANDLER,
        # Pods that pick this class land on this node: the nvidia runtime is only offered
        # where a pinned plugin decides which GPUs a pod gets. By our own label: the
        # kubernetes.io/hostname label need not equal the node's name.
        scheduling=as_args(derive(node, lambda n: node_class_scheduling(n.name))),
        opts=opts,
    )


def _config_map(
    prefix: str, identity: _Identity, node: Node, plugin_namespace: pulumi.Input[str], opts: pulumi.ResourceOptions
) -> k8s.core.v1.ConfigMap:
    return k8s.core.v1.ConfigMap(
        f"{prefix}-plugin-config",
        metadata=as_args(
            derive(identity.name, lambda name: config_map_metadata(name, identity.adopt, plugin_namespace))
        ),
        # Declared only for a time-sliced node, which has a config.
        data=derive(node, config_data),
        opts=opts,
    )


def _device_plugin(
    prefix: str,
    identity: _Identity,
    node: Node,
    plugin: DevicePluginConfig,
    *,
    plugin_namespace: pulumi.Input[str],
    runtime_class: pulumi.Input[str],
    opts: pulumi.ResourceOptions,
) -> k8s.apps.v1.DaemonSet:
    return k8s.apps.v1.DaemonSet(
        f"{prefix}-device-plugin",
        metadata=as_args(
            derive(identity.name, lambda name: plugin_metadata(name, identity.adopt, plugin, plugin_namespace))
        ),
        spec=as_args(derive(node, lambda n: plugin_spec(n, plugin, runtime_class))),
        opts=opts,
    )
