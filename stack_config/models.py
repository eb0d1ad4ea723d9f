"""What a valid hidden-gpu stack is.

Every rule about the `hidden-gpu:` configuration lives here, so that the Pulumi program, the
offline render and the host tools all accept and reject exactly the same stacks. Each key's
`description` is its documentation: docs/configuration.md is generated from these models.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, model_validator
from pydantic.alias_generators import to_camel

from common.names import (
    BASELINE_CAPABILITIES,
    CLUSTER_NAMESPACES,
    DEFAULT_CLUSTER_POLICY,
    DEFAULT_DCGM_EXPORTER_IMAGE,
    DEFAULT_DRA_PLUGIN_IMAGE,
    DEFAULT_EXEMPT_NAMESPACES,
    DEFAULT_PLUGIN_IMAGE,
    DEFAULT_PLUGIN_NAMESPACE,
    DOT_SEGMENT_PATTERN,
    NVIDIA_CLASS_DOMAIN,
    NVIDIA_DRA_DRIVER,
    OPERATOR_RUNTIME_CLASSES,
    PLUGIN_PRIORITY_CLASS,
    POOL_CLASS_INFIX,
    PROTECTED_HOST_PATHS,
    RUNTIME_CLASS_PREFIX,
    Allocator,
    DeviceListStrategy,
    GuardMode,
    GuardScope,
    MigStrategy,
    OperandMode,
    Role,
    ToolkitSettingsSource,
    plugin_labels,
    pool_class_name,
    runtime_class_name,
)
from stack_config.errors import MISSING, FieldProblemsError, Loc, key_path

# A device UUID as NVML and `nvidia-smi -L` print it: a prefix, then lowercase hex in this shape.
UUID_SHAPE = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
GPU_UUID = re.compile("GPU-" + UUID_SHAPE.replace("x", "[0-9a-f]"))
MIG_UUID = re.compile("MIG-" + UUID_SHAPE.replace("x", "[0-9a-f]"))
# DNS-1123 label: what Kubernetes accepts as a namespace name.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# DNS-1123 subdomain: what Kubernetes accepts as a node name.
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# An absolute path as the toolkit's filepath.Clean would leave it; the guard compares paths so.
NORMAL_PATH = re.compile(r"(/[^/]+)+")
DOT_SEGMENT = re.compile(DOT_SEGMENT_PATTERN)
CAPABILITY = re.compile(r"[A-Z][A-Z0-9_]*")
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?")
LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def _reject_index(value: object) -> object:
    # YAML turns `- 3` into an int and `- "3"` into a str; both are a person thinking in indices.
    if isinstance(value, bool):
        raise ValueError(f"not a GPU UUID: expected GPU-{UUID_SHAPE}")
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        raise ValueError(
            "a GPU index, not a UUID: indices can change across reboots and driver reloads, "
            "and then the hidden GPU is the one exposed; pin it by its UUID "
            "(python -m host.discover lists them)"
        )
    return value


def _check_gpu_uuid(value: str) -> str:
    if value.lower() in ("all", "none", "void"):
        raise ValueError("not a GPU: list each GPU by its UUID")
    if not GPU_UUID.fullmatch(value):
        raise ValueError(f"not a GPU UUID: expected GPU-{UUID_SHAPE} in lowercase hex, as nvidia-smi -L prints it")
    return value


def _check_device_uuid(value: str) -> str:
    """A whole GPU (GPU-...) or a MIG device (MIG-..., the format drivers since R470 print)."""
    if value.startswith("MIG-"):
        return _check_mig_uuid(value)
    return _check_gpu_uuid(value)


def _check_mig_uuid(value: str) -> str:
    if not MIG_UUID.fullmatch(value):
        raise ValueError(
            f"not a MIG device UUID: expected MIG-{UUID_SHAPE} in lowercase hex, "
            "as nvidia-smi -L prints it under its GPU"
        )
    return value


def _check_dns_label(value: str) -> str:
    if len(value) > 63 or not DNS_LABEL.fullmatch(value):
        raise ValueError(
            "not a valid namespace name: at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return value


def _check_node_name(value: str) -> str:
    # The plugin is pinned through the kubernetes.io/hostname label, and a label value holds at
    # most 63 characters: a longer node name could never be selected.
    if len(value) > 63 or not DNS_SUBDOMAIN.fullmatch(value):
        raise ValueError(
            "not a valid node name: at most 63 lowercase letters, digits, '-' and '.' "
            "(DNS-1123), as `kubectl get nodes` shows it"
        )
    return value


def _check_object_name(value: str) -> str:
    if len(value) > 253 or not DNS_SUBDOMAIN.fullmatch(value):
        raise ValueError("not a valid Kubernetes object name (DNS-1123 subdomain)")
    return value


def _check_image(value: str) -> str:
    repository, _, digest = value.partition("@")
    last_segment = repository.rsplit("/", 1)[-1]
    tag = last_segment.partition(":")[2] if ":" in last_segment else ""
    if digest and not IMAGE_DIGEST.fullmatch(digest):
        raise ValueError("malformed digest: expected @sha256:<64 hex digits>")
    if tag and not IMAGE_TAG.fullmatch(tag):
        raise ValueError("malformed tag")
    if not tag and not digest:
        raise ValueError("no tag or digest: pin the plugin version, e.g. ':v0.20.0'")
    if tag == "latest" and not digest:
        raise ValueError("':latest' is not a pinned version: pin the plugin version, e.g. ':v0.20.0'")
    return value


def _check_host_path(value: str) -> str:
    if value != "/" and (not NORMAL_PATH.fullmatch(value) or DOT_SEGMENT.search(value)):
        raise ValueError("not an absolute path in normal form (no //, /./, /../ or trailing /)")
    return value


def _check_tenant_host_path(value: str) -> str:
    for protected in PROTECTED_HOST_PATHS:
        if value == protected or _is_below(value, protected) or _is_below(protected, value):
            raise ValueError(
                f"never allowed to tenants: it is, holds or lies inside {protected} (devices, kernel views, runtime "
                "and kubelet sockets, which a read-only mount still lets a process connect to)"
            )
    return value


def _is_below(path: str, parent: str) -> bool:
    return path.startswith(parent.rstrip("/") + "/")


def _check_capability(value: str) -> str:
    if not CAPABILITY.fullmatch(value):
        raise ValueError("not a capability name: upper-case letters and '_', without CAP_ (e.g. NET_BIND_SERVICE)")
    if value in ("SYS_ADMIN", "ALL"):
        raise ValueError("never allowed: the NVIDIA toolkit treats SYS_ADMIN as privileged (every GPU)")
    return value


def _check_quantity(value: str) -> str:
    if not QUANTITY.fullmatch(value):
        raise ValueError("not a Kubernetes quantity (e.g. 50m, 64Mi, 1)")
    return value


def _check_label_key(value: str) -> str:
    if not LABEL_KEY.fullmatch(value) or len(value) > 317:
        raise ValueError("not a label key ([prefix/]name)")
    return value


def _check_label_value(value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
        raise ValueError("not a label value (at most 63 letters, digits, '-', '_', '.')")
    return value


GpuUuid = Annotated[str, BeforeValidator(_reject_index), AfterValidator(_check_gpu_uuid)]
DeviceUuid = Annotated[str, BeforeValidator(_reject_index), AfterValidator(_check_device_uuid)]
MigUuid = Annotated[str, AfterValidator(_check_mig_uuid)]
NamespaceName = Annotated[str, AfterValidator(_check_dns_label)]
NodeName = Annotated[str, AfterValidator(_check_node_name)]
ImageRef = Annotated[str, AfterValidator(_check_image)]
HostPath = Annotated[str, AfterValidator(_check_host_path)]
TenantHostPath = Annotated[str, AfterValidator(_check_host_path), AfterValidator(_check_tenant_host_path)]
Capability = Annotated[str, AfterValidator(_check_capability)]
ObjectName = Annotated[str, AfterValidator(_check_object_name)]
PoolName = Annotated[str, AfterValidator(_check_dns_label)]
Quantity = Annotated[str, AfterValidator(_check_quantity)]
LabelKey = Annotated[str, AfterValidator(_check_label_key)]
LabelValue = Annotated[str, AfterValidator(_check_label_value)]


# Stack files spell enum values as strings; strict mode would demand the enum object itself.
LaxEnum = Field(strict=False)


def _raise_any(problems: Iterable[tuple[Loc, Any, str]]) -> None:
    """Raise every problem a rule found at once, so they are reported together with the field errors."""
    found = list(problems)
    if found:
        raise FieldProblemsError(found)


class _Model(BaseModel):
    # Unknown keys are errors: a misspelt `hidenGpus` must never silently expose GPUs.
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        extra="forbid",
        frozen=True,
        strict=True,
        use_attribute_docstrings=True,
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


class OperandsConfig(_Model):
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


class TimeSlicingConfig(_Model):
    """The plugin's time-slicing: each exposed GPU is advertised `replicas` times."""

    replicas: Annotated[StrictInt, Field(ge=2)]
    """At least 2: how many times each exposed GPU is advertised."""
    rename_by_default: bool = False
    """Advertise `nvidia.com/gpu.shared` instead of `nvidia.com/gpu`."""
    fail_requests_greater_than_one: bool = False
    """Refuse pods that ask for more than one replica."""


class AdoptedPluginConfig(_Model):
    """A plugin DaemonSet made by hand (the recipe run without hidden-gpu) that `up` takes over for this node, instead
    of creating `nvidia-device-plugin-<node>` beside it: two plugins of one resource on a node leave the kubelet with
    no healthy GPU (docs/operations.md, "Adopting a hand-made setup")."""

    namespace: NamespaceName
    """The hand-made DaemonSet's namespace: it stays there (a DaemonSet cannot move), so it must be exempt from the
    guard (`guard.exemptNamespaces`, or `devicePlugin.namespace` itself)."""
    name: ObjectName
    """The hand-made DaemonSet's name: it keeps it."""
    match_labels: Annotated[dict[LabelKey, LabelValue], Field(min_length=1)]
    """Its `spec.selector.matchLabels`, exactly (`kubectl get ds -o jsonpath='{.spec.selector.matchLabels}'`): a
    DaemonSet's selector cannot change, so the taken-over one keeps it and its pods carry these labels too."""
    container: NamespaceName
    """The name of its plugin container: the taken-over container keeps it (server-side apply merges containers by
    name; another name would add a second plugin container beside it)."""


class NodeConfig(_Model):
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
    """A hand-made plugin DaemonSet to take over as this node's plugin, keeping its name, namespace, selector and
    container name; only on a node that exposes GPUs."""
    allocator: Annotated[Allocator, LaxEnum] = Allocator.DEVICE_PLUGIN
    """Who hands the exposed GPUs to pods, exactly one: `devicePlugin` (the pinned plugin, as `nvidia.com/gpu`) or
    `dra` (the stack's DeviceClass of the node or its pool, through NVIDIA's DRA driver; no plugin runs). The nodes
    of a pool share one."""

    @property
    def roles(self) -> dict[str, Role]:
        """Every GPU or MIG device the node lists, and which side it is on."""
        return {uuid: Role.EXPOSED for uuid in self.exposed_gpus} | {uuid: Role.HIDDEN for uuid in self.hidden_gpus}

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
        _raise_any(_node_problems(self))
        return self


class ResourceAmounts(_Model):
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


class PluginResources(_Model):
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
        _raise_any(
            (("requests", kind), getattr(self.requests, kind), f"above its limit {getattr(self.limits, kind)}")
            for kind in ("cpu", "memory")
            if quantity_value(getattr(self.requests, kind)) > quantity_value(getattr(self.limits, kind))
        )
        return self


class Toleration(_Model):
    """A toleration, as in a pod spec."""

    key: str | None = None
    """The taint key; empty with `Exists` tolerates every taint."""
    operator: Literal["Exists", "Equal"] = "Exists"
    """`Exists` or `Equal`."""
    value: str | None = None
    """The taint value, with `Equal`."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """The taint effect; empty tolerates all."""


class DevicePluginConfig(_Model):
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


class GuardConfig(_Model):
    """The admission policy that keeps pods away from hidden GPUs."""

    mode: Annotated[GuardMode, LaxEnum] = GuardMode.ENFORCE
    """`enforce` denies; `warn` admits, warns the client and annotates the audit log; `audit` only annotates."""
    exempt_namespaces: list[NamespaceName] = Field(default_factory=lambda: list(DEFAULT_EXEMPT_NAMESPACES))
    """Namespaces the guard does not check (trusted: they may reach any GPU); the plugin's namespace is always added."""
    exempt_namespace_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """Label `key: value` pairs: a namespace carrying any of them is exempt too, so the platform's CNI, CSI and
    monitoring namespaces can be trusted by a label instead of a stack edit each. Only who may label namespaces
    may then exempt one."""
    allowed_host_paths: list[TenantHostPath] = Field(default_factory=list)
    """Host paths tenant pods may mount, exactly and read-only only; any other hostPath is denied. Never `/`, `/dev`,
    `/proc`, `/sys`, `/run`, `/var/run`, the kubelet's or containerd's state, CDI specs or the toolkit's config, nor a
    path above or below one."""
    allowed_capabilities: list[Capability] = Field(default_factory=lambda: list(BASELINE_CAPABILITIES))
    """Capabilities tenant containers may add (compared as containerd does: any letter case, `CAP_` optional).
    Default: what Pod Security `baseline` allows. `SYS_ADMIN` and `ALL` are never allowed."""
    plain_runtime_classes: list[ObjectName] = Field(default_factory=list)
    """RuntimeClasses whose handler does not run the NVIDIA toolkit (e.g. `gvisor`, `kata`). A pod naming any other
    RuntimeClass is judged as running under NVIDIA's runtime: its every container must request an NVIDIA resource or
    set `NVIDIA_VISIBLE_DEVICES=void`. `cluster.verify` fails if a class listed here has an NVIDIA handler."""
    nvidia_is_default_runtime: bool = False
    """`true` if `nvidia` is containerd's default runtime on the GPU nodes: then every tenant container runs the
    toolkit, and each must request an NVIDIA resource or set `NVIDIA_VISIBLE_DEVICES=void`."""
    scope: Annotated[GuardScope, LaxEnum] = GuardScope.CLUSTER
    """Which pods the pod rules judge: `cluster`, every pod outside the exempt namespaces; `sharedNodes`, only pods
    that can reach a node of this stack: those tolerating the taint `hidden-gpu.io/shared-node` (which the platform
    puts on each such node: `kubectl taint node <node> hidden-gpu.io/shared-node=true:NoSchedule`), naming a node
    (`spec.nodeName`, which bypasses the scheduler's taints), or running under an NVIDIA runtime. Other pods are
    admitted untouched and can be scheduled to no shared node; `cluster.verify` fails on a stack node without the
    taint. The ConfigMap/Secret and claim policies judge the whole cluster either way."""
    allowed_device_classes: list[ObjectName] = Field(default_factory=list)
    """DeviceClass names (say a NIC class) tenants may use through Dynamic Resource Allocation: their ResourceClaims
    and ResourceClaimTemplates may name them, and their containers may request the class's extended resource
    `deviceclass.resource.kubernetes.io/<class>`. Every other class is denied outside exempt namespaces (the stack's
    own GPU classes, from `hidden-gpu:dra`, are added): a class selects whatever devices its selector matches, hidden
    GPUs included: `make render` warns of each where the stack hides GPUs, and `cluster.verify` fails if one selects a
    hidden GPU in a node's ResourceSlices. NVIDIA's own classes (`*.nvidia.com`) select every GPU the driver publishes
    and are refused."""
    add_void: bool = False
    """Add `NVIDIA_VISIBLE_DEVICES=void` to each new container under an NVIDIA runtime that neither requests an NVIDIA
    resource nor sets the variable (a sidecar, an init or `kubectl debug` container), instead of denying it; never to
    one that requests a GPU. A MutatingAdmissionPolicy: needs Kubernetes 1.36+ (`admissionregistration.k8s.io/v1`)."""

    @model_validator(mode="before")
    @classmethod
    def _retired_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _raise_any(((key,), data[key], reason) for key, reason in _RETIRED_GUARD_KEYS.items() if key in data)
        return data

    def exempt_with(self, plugin_namespace: str) -> list[str]:
        """The namespaces exempt from the guard: these, and the plugin's own always (its pods mount host paths)."""
        return sorted({*self.exempt_namespaces, plugin_namespace})

    @model_validator(mode="after")
    def _rules_across_fields(self) -> GuardConfig:
        _raise_any(
            (("plainRuntimeClasses", index), name, "an NVIDIA RuntimeClass (this stack's or the GPU Operator's)")
            for index, name in enumerate(self.plain_runtime_classes)
            if name in OPERATOR_RUNTIME_CLASSES or name.startswith(RUNTIME_CLASS_PREFIX)
        )
        _raise_any(
            (("allowedDeviceClasses", index), name, reason)
            for index, name in enumerate(self.allowed_device_classes)
            if (reason := _device_class_problem(name))
        )
        if self.scope == GuardScope.SHARED_NODES and self.nvidia_is_default_runtime:
            _raise_any(
                [
                    (
                        ("scope",),
                        str(self.scope),
                        "with nvidiaIsDefaultRuntime every pod runs under NVIDIA's runtime and is judged wherever it "
                        "runs: the scope would judge every pod anyway; set scope: cluster",
                    )
                ]
            )
        return self


_RETIRED_GUARD_KEYS = {
    "nvidiaRuntimeClasses": "retired: a list of NVIDIA classes is never complete, so every RuntimeClass is now judged "
    "as NVIDIA's unless listed in guard.plainRuntimeClasses; delete this key",
    "allowResourceClaims": "retired: tenants' ResourceClaims and ResourceClaimTemplates are now judged themselves, by "
    "the DeviceClasses they name: list the classes tenants may use in guard.allowedDeviceClasses (the stack's own GPU "
    "classes come from hidden-gpu:dra) and delete this key",
}


def _device_class_problem(name: str) -> str | None:
    """Why a tenant may not be allowed this DeviceClass, if so."""
    if name == NVIDIA_CLASS_DOMAIN or name.endswith(f".{NVIDIA_CLASS_DOMAIN}"):
        return (
            "an NVIDIA DeviceClass: it selects every device NVIDIA's DRA driver publishes, hidden GPUs included; "
            "set hidden-gpu:dra for classes of the exposed GPUs only"
        )
    if name.startswith(RUNTIME_CLASS_PREFIX):
        return "the stack's own DeviceClasses come from hidden-gpu:dra; list only other classes here"
    return None


class ClusterPolicyConfig(_Model):
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


class DraConfig(_Model):
    """DeviceClasses of the exposed GPUs, for clusters that allocate GPUs through Dynamic Resource Allocation."""

    driver: Annotated[ObjectName, AfterValidator(_nvidia_driver)] = NVIDIA_DRA_DRIVER
    """The DRA driver that publishes the GPUs: NVIDIA's, whose kubelet plugin hidden-gpu pins (`kubeletPluginImage`);
    each class selects only its devices whose `uuid` attribute is one of the exposed UUIDs there."""
    kubelet_plugin_image: ImageRef = DEFAULT_DRA_PLUGIN_IMAGE
    """The image of NVIDIA's DRA kubelet plugin (`gpu-kubelet-plugin`), which hidden-gpu runs on each DRA node pinned
    to its exposed GPUs, so that its ResourceSlice lists no hidden one; pinned by tag or digest, not `:latest`. It
    runs in the device plugin's namespace with its tolerations, priority class and pull secrets."""


class StackConfig(_Model):
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
        _raise_any(_stack_problems(self))
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
                yield here, uuid, f"GPU also listed on another node ({_short(first)}); a GPU belongs to one node"


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
            _as_given(stack.dra),
            "no node has allocator: dra, so every exposed GPU is the device plugin's: a DeviceClass of the same "
            "GPUs would hand each out twice; set allocator: dra on the nodes DRA should serve, or delete this key",
        )


def _adoption_stack_problems(stack: StackConfig) -> Iterator[tuple[Loc, Any, str]]:
    """An adopted plugin stays in its namespace, which the guard must exempt (its pods mount a host directory);
    each hand-made DaemonSet is one node's plugin."""
    first: dict[tuple[str, str], int] = {}
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
        if key in first:
            yield (
                ("nodes", node_index, "adoptDevicePlugin", "name"),
                adopt.name,
                f"also adopted by nodes[{first[key]}]: a DaemonSet is one node's plugin",
            )
        first.setdefault(key, node_index)


def _toolkit_problems(stack: StackConfig) -> Iterator[tuple[Loc, Any, str]]:
    """volume-mounts needs a toolkit that reads the mounts, and the stack must say who sets that;
    cdi-cri needs to know where the driver is."""
    plugin = stack.device_plugin
    cdi = plugin.device_list_strategy == DeviceListStrategy.CDI_CRI
    # The pinned DRA kubelet plugin reads NVML and nvidia-smi under the driver root too (components/dra_plugin.py).
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


def _as_given(model: BaseModel) -> dict[str, Any]:
    """A section as the stack file gave it, for an error line: no default filled in."""
    return model.model_dump(by_alias=True, exclude_unset=True)


def _dra_node_problems(node: NodeConfig) -> Iterator[tuple[Loc, Any, str]]:
    """Settings of the device plugin mean nothing where DRA hands the GPUs out; said, not silently dropped."""
    if node.allocator != Allocator.DRA:
        return
    if node.adopt_device_plugin is not None:
        reason = "a hand-made plugin would hand the GPUs out beside DRA; delete it, or keep allocator: devicePlugin"
        yield ("adoptDevicePlugin",), _as_given(node.adopt_device_plugin), f"not with allocator: dra: {reason}"
    if node.time_slicing is not None:
        reason = "time-slicing is the device plugin's; hidden-gpu shares no GPU through DRA yet"
        yield ("timeSlicing",), _as_given(node.time_slicing), f"not with allocator: dra: {reason}"
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
    for key, value in adopt.match_labels.items():
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
            yield place, uuid, f"GPU is both exposed and hidden (also at {_short(first)}); choose one"
        else:
            yield place, uuid, f"GPU listed twice on this node (also at {_short(first)})"


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


def _short(loc: Loc) -> str:
    """nodes[0].exposedGpus[1]: a place as messages name it, without the `hidden-gpu:` prefix."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


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
