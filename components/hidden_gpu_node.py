"""HiddenGpuNode: one shared GPU node on which Kubernetes sees only the exposed GPUs."""

# No `from __future__ import annotations`: Pulumi's analyzer (package/) reads the annotations as types.
import hashlib
import typing
from collections.abc import Mapping
from typing import NamedTuple, NotRequired, TypedDict

import pulumi
import pulumi_kubernetes as k8s
import yaml

from common.names import (
    CDI_SPEC_DIR,
    CONFIG_CHECKSUM_ANNOTATION,
    CONTAINER_DRIVER_ROOT,
    DEFAULT_DRA_PLUGIN_IMAGE,
    FIELD_MANAGER,
    FIELD_MANAGER_ANNOTATION,
    GPU_RESOURCE,
    KUBELET_DEVICE_PLUGINS,
    NODE_LABEL,
    NODE_OUTPUT_KEYS,
    NVIDIA_RUNTIME_HANDLER,
    OPERANDS_OFF_ANNOTATION,
    PATCH_FORCE_ANNOTATION,
    PLUGIN_CONFIG_FILE,
    PLUGIN_CONFIG_KEY,
    PLUGIN_NAME,
    VISIBLE_DEVICES_ENV,
    Allocator,
    DeviceListStrategy,
    MigStrategy,
    Token,
    device_plugin_name,
    plugin_config_name,
    plugin_labels,
    runtime_class_name,
)
from components.dra_plugin import DraPluginObjects
from components.inputs import derive, is_plain, validated_input
from components.node_labels import node_labels, operands_off, pinned_operands, planned_operands, runtime_class_of
from components.node_pods import (
    device_requests,
    node_pod_spec,
    plugin_config_volume,
    runtime_scheduling,
    scan_exceptions,
    unprivileged,
)
from components.pinned_operands import pinned_operand
from components.stack_types import DevicePluginSpec, NodeSpec
from stack_config.errors import MISSING_KEY, ConfigError, InvalidInputError, as_written, unknown_key, validated
from stack_config.models import (
    AdoptedPluginConfig,
    DevicePluginConfig,
    DraConfig,
    ImageRef,
    NodeConfig,
    NodeName,
    OperandsConfig,
)

# Checks of the security scan (make scan) that the plugin deliberately does not meet.
SCAN_EXCEPTIONS = {
    "CKV_K8S_8": "the plugin serves gRPC on a kubelet unix socket only; it has no endpoint to probe",
    "CKV_K8S_9": "the plugin serves gRPC on a kubelet unix socket only; it has no endpoint to probe",
    "CKV_K8S_22": "the upstream manifest runs the plugin with a writable root; read-only not yet tried on a node",
    "CKV_K8S_23": "the plugin must create its socket in the root-owned /var/lib/kubelet/device-plugins",
    "CKV_K8S_40": "the plugin must create its socket in the root-owned /var/lib/kubelet/device-plugins",
    "CKV_K8S_15": "the image is pinned; Always would make a plugin restart depend on the registry",
}
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
        return _Identity(node.name, node.adopt_device_plugin)
    if "name" not in spec:
        raise InvalidInputError.of([ConfigError(("node", "name"), MISSING_KEY)])
    # The other keys are plain (_spec): what the whole node's model would say of them, it says at once here.
    written = spec.get("adoptDevicePlugin")
    adopt = None if written is None else validated(AdoptedPluginConfig, written, ("node", "adoptDevicePlugin"))
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
        devicePlugin=_plugin_name(node.name, node.adopt_device_plugin) if node.runs_plugin else None,
        runtimeClass=runtime_class_of(node)[0] if node.exposed_gpus else None,
    )


def _namespace(adopt: AdoptedPluginConfig | None, plugin_namespace: pulumi.Input[str]) -> pulumi.Input[str]:
    """An adopted plugin stays where it was made (a DaemonSet cannot move), its config beside it."""
    return plugin_namespace if adopt is None else adopt.namespace


def _plugin_name(name: str, adopt: AdoptedPluginConfig | None) -> str:
    return device_plugin_name(name) if adopt is None else adopt.name


def plugin_config(node: NodeConfig) -> str | None:
    """The plugin's `version: v1` config file, where the node time-slices. Time-slicing applies to
    every GPU the plugin sees, and the pinned plugin sees only the exposed ones."""
    if node.time_slicing is None:
        return None
    sharing = node.time_slicing
    config = {
        "version": "v1",
        "flags": {"migStrategy": str(node.mig_strategy)},
        "sharing": {
            "timeSlicing": {
                "renameByDefault": sharing.rename_by_default,
                "failRequestsGreaterThanOne": sharing.fail_requests_greater_than_one,
                "resources": [{"name": GPU_RESOURCE, "replicas": sharing.replicas}],
            }
        },
    }
    return yaml.safe_dump(config, sort_keys=False)


def _runtime_class(
    prefix: str, identity: _Identity, node: Node, opts: pulumi.ResourceOptions
) -> k8s.node.v1.RuntimeClass:
    # Metadata from the name alone (a preview that knows it names the object, rather than the provider auto-naming
    # it); the scheduling from the validated node, so an `up` declares nothing before the whole node is judged.
    return k8s.node.v1.RuntimeClass(
        f"{prefix}-runtime-class",
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=derive(identity.name, runtime_class_name), labels=derive(identity.name, plugin_labels)
        ),
        handler=NVIDIA_RUNTIME_HANDLER,
        # Pods that pick this class land on this node: the nvidia runtime is only offered
        # where a pinned plugin decides which GPUs a pod gets. By our own label: the
        # kubernetes.io/hostname label need not equal the node's name.
        scheduling=derive(node, lambda n: runtime_scheduling(NODE_LABEL, n.name)),
        opts=opts,
    )


def _config_map(
    prefix: str, identity: _Identity, node: Node, plugin_namespace: pulumi.Input[str], opts: pulumi.ResourceOptions
) -> k8s.core.v1.ConfigMap:
    return k8s.core.v1.ConfigMap(
        f"{prefix}-plugin-config",
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=derive(identity.name, plugin_config_name),
            namespace=_namespace(identity.adopt, plugin_namespace),
            labels=derive(identity.name, plugin_labels),
        ),
        # Declared only for a time-sliced node, which has a config.
        data=derive(node, lambda n: {PLUGIN_CONFIG_KEY: typing.cast(str, plugin_config(n))}),
        opts=opts,
    )


def _env(node: NodeConfig, plugin: DevicePluginConfig, config: str | None) -> list[k8s.core.v1.EnvVarArgs]:
    env = {
        # Also overrides the image's own `ENV NVIDIA_VISIBLE_DEVICES=all`.
        VISIBLE_DEVICES_ENV: ",".join(node.exposed_gpus),
        "DEVICE_ID_STRATEGY": "uuid",
        "DEVICE_LIST_STRATEGY": str(plugin.device_list_strategy),
        "FAIL_ON_INIT_ERROR": "true",
        "MIG_STRATEGY": str(node.mig_strategy),
    }
    if node.mig_strategy != MigStrategy.NONE:
        env["NVIDIA_MIG_MONITOR_DEVICES"] = "all"
    if config is not None:
        env["CONFIG_FILE"] = PLUGIN_CONFIG_FILE
    if plugin.device_list_strategy == DeviceListStrategy.CDI_CRI:
        # The spec the plugin writes lists only what it sees: the exposed GPUs.
        env["NVIDIA_DRIVER_ROOT"] = plugin.nvidia_driver_root
        env["CONTAINER_DRIVER_ROOT"] = CONTAINER_DRIVER_ROOT
        if plugin.nvidia_cdi_hook_path is not None:
            env["NVIDIA_CDI_HOOK_PATH"] = plugin.nvidia_cdi_hook_path
    return [k8s.core.v1.EnvVarArgs(name=name, value=value) for name, value in env.items()]


def _security_context(node: NodeConfig) -> k8s.core.v1.SecurityContextArgs:
    # MIG is the one exception to "no capabilities": the toolkit mounts the MIG monitor
    # capability that NVIDIA_MIG_MONITOR_DEVICES asks for only into a container with SYS_ADMIN,
    # which it then treats as privileged: the variable is honoured whatever the toolkit's
    # unprivileged settings say. The plugin still sees only the GPUs it names (and every MIG
    # device of those GPUs, hence the config's split rule); tenants' SYS_ADMIN stays denied by
    # the access guard, which exempts only the plugin's namespace.
    return unprivileged(["SYS_ADMIN"] if node.mig_strategy != MigStrategy.NONE else None)


def _volumes(
    node: NodeConfig, plugin: DevicePluginConfig, config: str | None
) -> tuple[list[k8s.core.v1.VolumeArgs], list[k8s.core.v1.VolumeMountArgs]]:
    volumes = [
        k8s.core.v1.VolumeArgs(
            name="device-plugin",
            host_path=k8s.core.v1.HostPathVolumeSourceArgs(path=KUBELET_DEVICE_PLUGINS, type="Directory"),
        )
    ]
    mounts = [k8s.core.v1.VolumeMountArgs(name="device-plugin", mount_path=KUBELET_DEVICE_PLUGINS)]
    if config is not None:
        volume, mount = plugin_config_volume(node.name)
        volumes.append(volume)
        mounts.append(mount)
    requests, request_mounts = device_requests(node, plugin)
    volumes += requests
    mounts += request_mounts
    if plugin.device_list_strategy == DeviceListStrategy.CDI_CRI:
        volumes += [
            k8s.core.v1.VolumeArgs(
                name="driver-root",
                host_path=k8s.core.v1.HostPathVolumeSourceArgs(path=plugin.nvidia_driver_root, type="Directory"),
            ),
            k8s.core.v1.VolumeArgs(
                name="cdi-root",
                host_path=k8s.core.v1.HostPathVolumeSourceArgs(path=CDI_SPEC_DIR, type="DirectoryOrCreate"),
            ),
        ]
        mounts += [
            k8s.core.v1.VolumeMountArgs(name="driver-root", mount_path=CONTAINER_DRIVER_ROOT, read_only=True),
            k8s.core.v1.VolumeMountArgs(name="cdi-root", mount_path=CDI_SPEC_DIR),
        ]
    return volumes, mounts


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
        metadata=_plugin_metadata(identity, plugin, plugin_namespace),
        spec=derive(node, lambda n: _plugin_spec(n, plugin, runtime_class)),
        opts=opts,
    )


def _plugin_metadata(
    identity: _Identity, plugin: DevicePluginConfig, plugin_namespace: pulumi.Input[str]
) -> k8s.meta.v1.ObjectMetaArgs:
    adopt = identity.adopt
    annotations = scan_exceptions(SCAN_EXCEPTIONS, plugin.image, "devicePlugin.image")
    if adopt is not None:
        # Taking over a hand-made DaemonSet: a forced server-side apply under hidden-gpu's field manager, not
        # `pulumi import`. The provider creates by server-side apply (a PATCH, so an existing object is upserted:
        # pulumi-kubernetes v4.25 pkg/await/await.go), and patchForce takes every field this declares from the
        # hand-made manager; an import would need each object's ID in the program and a first `up` that changes
        # nothing. Fields only the hand-made manager set and this does not declare stay: cluster.verify names them.
        annotations = {**annotations, PATCH_FORCE_ANNOTATION: "true", FIELD_MANAGER_ANNOTATION: FIELD_MANAGER}
    return k8s.meta.v1.ObjectMetaArgs(
        name=derive(identity.name, lambda name: _plugin_name(name, adopt)),
        namespace=_namespace(adopt, plugin_namespace),
        labels=derive(identity.name, plugin_labels),
        annotations=annotations,
    )


def _plugin_spec(
    node: NodeConfig, plugin: DevicePluginConfig, runtime_class: pulumi.Input[str]
) -> k8s.apps.v1.DaemonSetSpecArgs:
    labels = plugin_labels(node.name)
    selector, pod_labels = labels, labels
    adopt = node.adopt_device_plugin
    if adopt is not None:
        # An adopted DaemonSet's selector is immutable, so it stays the hand-made one and the pods carry both its
        # labels and ours (cluster.verify finds them by ours); the container keeps its name, as containers merge by
        # name.
        selector = dict(adopt.match_labels)
        pod_labels = {**adopt.match_labels, **labels}
    config = plugin_config(node)
    volumes, mounts = _volumes(node, plugin, config)
    container = k8s.core.v1.ContainerArgs(
        name=PLUGIN_NAME if adopt is None else adopt.container,
        image=plugin.image,
        image_pull_policy="IfNotPresent",
        env=_env(node, plugin, config),
        security_context=_security_context(node),
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests=plugin.resources.requests.model_dump(), limits=plugin.resources.limits.model_dump()
        ),
        volume_mounts=mounts,
    )
    pod_spec = node_pod_spec(node.name, plugin, runtime_class, [container], volumes)
    checksum = {CONFIG_CHECKSUM_ANNOTATION: hashlib.sha256(config.encode()).hexdigest()} if config else None
    return k8s.apps.v1.DaemonSetSpecArgs(
        selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
        # One plugin pod at a time, stated rather than left to the default (which a hand-made DaemonSet may
        # have changed): a surge pod would register the same resource while the old one runs, and the kubelet
        # then disconnects the newer one when the older one's stream ends (every GPU unhealthy).
        update_strategy=k8s.apps.v1.DaemonSetUpdateStrategyArgs(
            type="RollingUpdate",
            rolling_update=k8s.apps.v1.RollingUpdateDaemonSetArgs(max_surge=0, max_unavailable=1),
        ),
        template=k8s.core.v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(labels=pod_labels, annotations=checksum), spec=pod_spec
        ),
    )
