"""What a valid hidden-gpu stack is.

Every rule about the `hidden-gpu:` configuration lives here, so that the Pulumi program, the
offline render and the host tools all accept and reject exactly the same stacks.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictInt
from pydantic.alias_generators import to_camel

from stack_config.errors import ConfigError, config_key

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

DEFAULT_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
DEFAULT_PLUGIN_NAMESPACE = "hidden-gpu-system"
DEFAULT_EXEMPT_NAMESPACES = ("kube-system", "gpu-operator")
DEFAULT_CLUSTER_POLICY = "cluster-policy"


def _reject_index(value: object) -> object:
    # YAML turns `- 3` into an int and `- "3"` into a str; both are a person thinking in indices.
    if isinstance(value, bool):
        raise ValueError(f"not a GPU UUID: expected GPU-{UUID_SHAPE}")
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        raise ValueError(
            "a GPU index, not a UUID: indices can change across reboots and driver reloads, "
            "and then the hidden GPU is the one exposed; pin it by its UUID "
            "(python -m tools.discover lists them)"
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


GpuUuid = Annotated[str, BeforeValidator(_reject_index), AfterValidator(_check_gpu_uuid)]
DeviceUuid = Annotated[str, BeforeValidator(_reject_index), AfterValidator(_check_device_uuid)]
MigUuid = Annotated[str, AfterValidator(_check_mig_uuid)]
NamespaceName = Annotated[str, AfterValidator(_check_dns_label)]
NodeName = Annotated[str, AfterValidator(_check_node_name)]
ImageRef = Annotated[str, AfterValidator(_check_image)]


class _Model(BaseModel):
    # Unknown keys are errors: a misspelt `hidenGpus` must never silently expose GPUs.
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        extra="forbid",
        frozen=True,
        strict=True,
    )


class OperandsConfig(_Model):
    """Which other GPU Operator operands still run on the node (`nvidia.com/gpu.deploy.<operand>`).

    GFD is off by default because its labels (gpu.count, gpu.product, gpu.memory) reveal the
    hidden GPUs; mig-manager because it applies MIG profiles to every GPU, the other
    organisation's too. dcgm-exporter stays: it only reads metrics.
    """

    gpu_feature_discovery: bool = False
    mig_manager: bool = False
    dcgm_exporter: bool = True


class TimeSlicingConfig(_Model):
    """The plugin's time-slicing: each exposed GPU is advertised `replicas` times."""

    replicas: Annotated[StrictInt, Field(ge=2)]
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False


class NodeConfig(_Model):
    name: NodeName
    exposed_gpus: list[DeviceUuid]
    hidden_gpus: list[DeviceUuid] = Field(default_factory=list)
    operands: OperandsConfig = OperandsConfig()
    time_slicing: TimeSlicingConfig | None = None
    mig_strategy: Literal["none", "single", "mixed"] = "none"
    # The node's MIG layout, parent GPU -> its MIG devices: the only way to know a MIG device's
    # parent, which the split rule needs (tools.discover --expose writes it).
    mig_devices: dict[GpuUuid, list[MigUuid]] = Field(default_factory=dict)

    @property
    def roles(self) -> dict[str, str]:
        """Every GPU or MIG device the node lists, and whether it is `exposed` or `hidden`."""
        return {uuid: "exposed" for uuid in self.exposed_gpus} | {uuid: "hidden" for uuid in self.hidden_gpus}

    @property
    def replicas(self) -> int:
        return self.time_slicing.replicas if self.time_slicing else 1

    @property
    def advertised_gpus(self) -> int:
        """How many `nvidia.com/gpu` the node's plugin advertises. Under the mixed strategy MIG
        devices are advertised as `nvidia.com/mig-<profile>` instead."""
        counted = [u for u in self.exposed_gpus if not (self.mig_strategy == "mixed" and u.startswith("MIG-"))]
        return len(counted) * self.replicas


class DevicePluginConfig(_Model):
    image: ImageRef = DEFAULT_PLUGIN_IMAGE
    namespace: NamespaceName = DEFAULT_PLUGIN_NAMESPACE
    create_namespace: bool = True
    # envvar: the recipe's. volume-mounts: the plugin hands out GPUs as /dev/null mounts, for a
    # toolkit that ignores NVIDIA_VISIBLE_DEVICES from unprivileged pods.
    device_list_strategy: Literal["envvar", "volume-mounts"] = "envvar"


class GuardConfig(_Model):
    """The admission policy that keeps pods away from hidden GPUs."""

    mode: Literal["enforce", "warn", "audit"] = "enforce"
    exempt_namespaces: list[NamespaceName] = Field(default_factory=lambda: list(DEFAULT_EXEMPT_NAMESPACES))


class ClusterPolicyConfig(_Model):
    """Opt-in patch of the GPU Operator's ClusterPolicy so the toolkit ignores the env var route."""

    patch: bool = False
    name: Annotated[str, AfterValidator(_check_object_name)] = DEFAULT_CLUSTER_POLICY


class StackConfig(_Model):
    """The `hidden-gpu:` keys of one stack, without their prefix."""

    nodes: Annotated[list[NodeConfig], Field(min_length=1)]
    quotas: dict[NamespaceName, Annotated[StrictInt, Field(ge=0)]] = Field(default_factory=dict)
    device_plugin: DevicePluginConfig = DevicePluginConfig()
    guard: GuardConfig = GuardConfig()
    cluster_policy: ClusterPolicyConfig = ClusterPolicyConfig()

    @property
    def exempt_namespaces(self) -> list[str]:
        """The guard's exemptions; the plugin's own namespace always, its pods mount host paths."""
        return sorted({*self.guard.exempt_namespaces, self.device_plugin.namespace})

    def model_post_init(self, context: object, /) -> None:
        _check_cross_references(self)


def _check_cross_references(stack: StackConfig) -> None:
    """Rules that span several fields; raised with the full key path of the offending value."""
    if stack.cluster_policy.patch and stack.device_plugin.device_list_strategy != "volume-mounts":
        raise ConfigError(
            config_key("clusterPolicy.patch"),
            True,
            "needs devicePlugin.deviceListStrategy: volume-mounts: once the toolkit ignores "
            "NVIDIA_VISIBLE_DEVICES, a plugin using env vars hands out GPUs no pod receives",
        )
    first_node_index: dict[str, int] = {}
    first_gpu_place: dict[str, str] = {}
    for node_index, node in enumerate(stack.nodes):
        node_path = f"nodes[{node_index}]"
        if node.name in first_node_index:
            raise ConfigError(
                config_key(f"{node_path}.name"),
                node.name,
                f"node listed twice (also nodes[{first_node_index[node.name]}])",
            )
        first_node_index[node.name] = node_index
        for field, uuids in (("exposedGpus", node.exposed_gpus), ("hiddenGpus", node.hidden_gpus)):
            for gpu_index, uuid in enumerate(uuids):
                place = f"{node_path}.{field}[{gpu_index}]"
                if uuid in first_gpu_place:
                    raise ConfigError(config_key(place), uuid, _twice(first_gpu_place[uuid], place))
                first_gpu_place[uuid] = place
        _check_mig(node, node_path, first_gpu_place)


def _check_mig(node: NodeConfig, node_path: str, place_of: dict[str, str]) -> None:
    if node.time_slicing and node.mig_strategy == "mixed":
        raise ConfigError(
            config_key(f"{node_path}.timeSlicing"),
            node.time_slicing.model_dump(by_alias=True),
            "time-slicing here shares nvidia.com/gpu; with migStrategy mixed MIG devices are "
            "advertised per profile instead: use migStrategy single, or no time-slicing",
        )
    parent_of: dict[str, str] = {}
    for parent, devices in node.mig_devices.items():
        for index, mig in enumerate(devices):
            if mig in parent_of:
                raise ConfigError(
                    config_key(f"{node_path}.migDevices.{parent}[{index}]"), mig, f"also listed under {parent_of[mig]}"
                )
            parent_of[mig] = parent
    side_of = node.roles
    for uuid in side_of:
        if not uuid.startswith("MIG-"):
            continue
        if node.mig_strategy == "none":
            raise ConfigError(
                config_key(place_of[uuid]), uuid, "a MIG device needs migStrategy single or mixed on this node"
            )
        if uuid not in parent_of:
            raise ConfigError(
                config_key(place_of[uuid]),
                uuid,
                "parent GPU unknown: list the node's MIG layout under migDevices "
                "(python -m tools.discover --expose writes it)",
            )
    for parent, devices in node.mig_devices.items():
        listed = [uuid for uuid in (parent, *devices) if uuid in side_of]
        exposed = [uuid for uuid in listed if side_of[uuid] == "exposed"]
        hidden = [uuid for uuid in listed if side_of[uuid] == "hidden"]
        if exposed and hidden:
            raise ConfigError(
                config_key(place_of[exposed[0]]),
                exposed[0],
                f"exposed, but {hidden[0]} of the same GPU ({parent}) is hidden: a plugin that can see "
                "one MIG device of a GPU monitors all of them (NVIDIA_MIG_MONITOR_DEVICES=all); "
                "keep a GPU and all its MIG devices on one side",
            )


def _twice(first: str, second: str) -> str:
    first_node, second_node = first.split(".", maxsplit=1)[0], second.split(".", maxsplit=1)[0]
    if first_node != second_node:
        return f"GPU also listed on another node ({first}); a GPU belongs to one node"
    if first.split(".")[1].split("[", maxsplit=1)[0] != second.split(".")[1].split("[", maxsplit=1)[0]:
        return f"GPU is both exposed and hidden (also at {first}); choose one"
    return f"GPU listed twice on this node (also at {first})"


def quota_warnings(stack: StackConfig) -> list[str]:
    """Quotas above what this stack's nodes can ever advertise: not wrong (the cluster may have
    other GPU nodes), but often a forgotten time-slicing or a typo."""
    advertised = sum(node.advertised_gpus for node in stack.nodes)
    return [
        f"{config_key(f'quotas.{namespace}')} = {limit}: more than the {advertised} nvidia.com/gpu "
        "this stack's nodes advertise"
        for namespace, limit in sorted(stack.quotas.items())
        if limit > advertised
    ]
