"""Every name hidden-gpu gives or looks for: objects, labels, annotations, host paths, type tokens,
resources and the named values of its settings. Config, components, policy pack and tools import
them from here; nothing re-types them. Standard library only: the GPU-host tools import it too.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

PROJECT = "hidden-gpu"
# Where the program finds its stack file when it is not in Pulumi.yaml's stackConfigDir (an Automation
# API program's workspace): it applies only what that file says.
STACK_FILE_ENV = "HIDDEN_GPU_STACK_FILE"


# --- Named values of settings (the strings are what stack files and the plugin's env carry) ---


class MigStrategy(StrEnum):
    """The device plugin's MIG_STRATEGY."""

    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


class DeviceListStrategy(StrEnum):
    """How the device plugin tells the container toolkit which GPUs a container got."""

    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"
    # The plugin writes a CDI spec of the GPUs it sees and answers allocations with CDI device
    # names in the CRI field; containerd injects them natively (the GPU Operator's CDI mode).
    CDI_CRI = "cdi-cri"


class ToolkitSettingsSource(StrEnum):
    """Who makes the container toolkit accept device requests as volume mounts."""

    CLUSTER_POLICY = "clusterPolicy"  # this stack's ClusterPolicy patch (clusterPolicy.patch: true)
    NODE_CONFIG = "nodeConfig"  # an admin, in /etc/nvidia-container-runtime/config.toml on every GPU node


class GuardMode(StrEnum):
    """What the access guard does with a pod that breaks a rule."""

    ENFORCE = "enforce"
    WARN = "warn"
    AUDIT = "audit"


class GuardScope(StrEnum):
    """Which pods the access guard's pod rules judge, outside the exempt namespaces."""

    CLUSTER = "cluster"  # every pod
    # Those that can reach a shared node: tolerating SHARED_NODE_TAINT, naming a node, or under an NVIDIA runtime.
    SHARED_NODES = "sharedNodes"


class OperandMode(StrEnum):
    """What runs of a GPU-reading operand (GPU Feature Discovery, dcgm-exporter) on a hidden-gpu node, besides off."""

    # hidden-gpu runs it, pinned to the exposed GPUs as the device plugin is; the operator's own stays off.
    PINNED = "pinned"
    # Neither runs (`false` in a stack file).
    OFF = "off"


class Allocator(StrEnum):
    """Who hands a node's exposed GPUs to pods: exactly one, as the scheduler's resource fit and the DRA allocator
    never consult each other (two would let a GPU go out twice)."""

    DEVICE_PLUGIN = "devicePlugin"  # the pinned plugin advertises them as nvidia.com/gpu
    DRA = "dra"  # the stack's DeviceClass selects them in the DRA driver's ResourceSlices


class Role(StrEnum):
    """Which side of the node a listed GPU or MIG device is on."""

    EXPOSED = "exposed"
    HIDDEN = "hidden"


# --- Kubernetes resources and labels ---

# The API server's own label on every namespace, its name (immutable, set since v1.21): the guard exempts by it.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

# The taint a platform puts on every node of a stack whose guard judges shared nodes only (guard.scope): a pod that
# does not tolerate it can be scheduled to none of them. hidden-gpu's RuntimeClasses always tolerate it.
SHARED_NODE_TAINT = "hidden-gpu.io/shared-node"
SHARED_NODE_TAINT_EFFECT: Final = "NoSchedule"

GPU_RESOURCE = "nvidia.com/gpu"
# Extended resources only take the `requests.` prefix in a ResourceQuota.
GPU_QUOTA_KEY = f"requests.{GPU_RESOURCE}"
# The GPU Operator deploys its device plugin on a node unless this label is `false`.
DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"
# The operator's other per-node operand switches, by the OperandsConfig field that sets each.
OPERAND_LABELS = {
    "gpu_feature_discovery": "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "mig_manager": "nvidia.com/gpu.deploy.mig-manager",
    "dcgm": "nvidia.com/gpu.deploy.dcgm",
    "dcgm_exporter": "nvidia.com/gpu.deploy.dcgm-exporter",
    "operator_validator": "nvidia.com/gpu.deploy.operator-validator",
    "container_toolkit": "nvidia.com/gpu.deploy.container-toolkit",
}
# The operator's switch for all its operands on a node: `false` makes it delete every gpu.deploy.* label there
# (gpu-operator@v0.0.0-20250917190837-d73a0086a6ba controllers/state_manager.go:344-369), removing it makes it add
# the absent ones as `true` (:377-391).
OPERANDS_LABEL = "nvidia.com/gpu.deploy.operands"
DEPLOY_LABEL_PREFIX = "nvidia.com/gpu.deploy."
# On a hidden node: the operands (gpu.deploy.<name>) hidden-gpu holds off, comma-separated; the node-switches policy
# reads it, so the node patch that changes the switches changes the record in the same write.
OPERANDS_OFF_ANNOTATION = "hidden-gpu.io/operands-off"
# The operator calls a node a GPU node when NFD labels it with NVIDIA's PCI vendor (state_manager.go:113-117, 259)
# and then labels it gpu.present=true; a node that loses the NFD label is reset (:517-527). Its Node watch reconciles
# when a GPU node lacks gpu.present (clusterpolicy_controller.go:294): cluster.release uses that to have the operator
# label a released node again.
NFD_GPU_LABEL = "feature.node.kubernetes.io/pci-10de.present"
NFD_GPU_LABELS = (
    NFD_GPU_LABEL,
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
# Labels hidden-gpu sets on its nodes, which its RuntimeClasses schedule by: the node's name (the
# kubernetes.io/hostname label need not equal it) and the node's pool.
NODE_LABEL = "hidden-gpu.io/node"
POOL_LABEL = "hidden-gpu.io/pool"
# On each stack's record (a ConfigMap): the stack it describes. Tools judge "which stack still
# hides this node" by the records in the cluster they talk to, not by the file they were handed.
STACK_LABEL = "hidden-gpu.io/stack"
PART_OF_LABEL = "app.kubernetes.io/part-of"
INSTANCE_LABEL = "app.kubernetes.io/instance"
PLUGIN_NAME_LABEL = "app.kubernetes.io/name"
PART_OF = PROJECT
POD_SECURITY_ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
# Annotations that tell pulumi-kubernetes how to apply an object: the provider's, not the object's state.
PROVIDER_ANNOTATION_PREFIX = "pulumi.com/"
# Server-side apply refuses to take over fields another manager owns unless forced.
PATCH_FORCE_ANNOTATION = f"{PROVIDER_ANNOTATION_PREFIX}patchForce"
# pulumi-kubernetes applies an object with server-side apply as the field manager this annotation names
# (provider.go fieldManagerName), else under a random pulumi-kubernetes-<suffix> per stack: a retained
# object could then never be taken back by another `up` without a conflict.
FIELD_MANAGER_ANNOTATION = f"{PROVIDER_ANNOTATION_PREFIX}patchFieldManager"
FIELD_MANAGER = PROJECT
# A changed plugin config changes this pod-template annotation, so the DaemonSet rolls its pods.
CONFIG_CHECKSUM_ANNOTATION = "hidden-gpu/plugin-config-sha256"
# checkov reads in-manifest skips from `checkov.io/skip<N>: CHECK=reason`.
SCAN_SKIP_ANNOTATION_PREFIX = "checkov.io/skip"
# The GPU Operator's plugin DaemonSet labels its pods so (`app=` this).
OPERATOR_PLUGIN_APP = "nvidia-device-plugin-daemonset"

# The operator's operands that read every GPU of a node, by the OperandsConfig field: hidden-gpu can run each itself,
# pinned to the exposed GPUs (OperandMode.PINNED), under these names (its DaemonSet `<name>-<node>`, its pods'
# app.kubernetes.io/name). The operator labels their pods `app=` these values (assets/gpu-feature-discovery and
# assets/state-dcgm-exporter of gpu-operator@v0.0.0-20250917190837-d73a0086a6ba).
PINNED_OPERANDS = {"gpu_feature_discovery": "gpu-feature-discovery", "dcgm_exporter": "dcgm-exporter"}
OPERATOR_OPERAND_APPS = {"gpu_feature_discovery": "gpu-feature-discovery", "dcgm_exporter": "nvidia-dcgm-exporter"}

# The keys of a node's entry that HiddenGpuNode also takes as Outputs (typed `pulumi.Input` in its generated
# NodeSpec): they only fill objects' fields. The other keys decide which objects the node gets, known in any preview.
NODE_OUTPUT_KEYS = ("name", "exposedGpus", "hiddenGpus")


# --- Names of the objects hidden-gpu creates ---

# In a render directory, beside the objects (JSON, so no *.yaml reader takes it for one): the Pulumi
# resource graph and each node's GPUs by role.
GRAPH_FILE = "_pulumi-graph.json"

PLUGIN_NAME = "nvidia-device-plugin"
# The init container of a plugin that replaces a hand-made one serving several nodes: it waits until no NVIDIA
# plugin socket is left in the kubelet's directory (nvidia-<resource>.sock: k8s-device-plugin v0.20.0
# internal/plugin/server.go:103-107, removed once its server stopped, :163-174).
PLUGIN_WAIT_CONTAINER = "wait-for-other-plugins"
PLUGIN_SOCKET_GLOB = "nvidia-*.sock"
PLUGIN_NETWORK_POLICY = f"{PLUGIN_NAME}-no-network"
# The pinned operands' pods: no egress, ingress only to dcgm-exporter's metrics port (GFD listens on nothing).
OPERANDS_NETWORK_POLICY = f"{PROJECT}-operands-metrics-only"
POLICY_NAME = f"{PROJECT}-access-guard"
# The guard's second policy: ConfigMap and Secret keys a container's envFrom would turn into env.
ENV_KEYS_POLICY_NAME = f"{PROJECT}-env-keys"
# The optional mutating policy that adds NVIDIA_VISIBLE_DEVICES=void where a container would otherwise be denied.
VOID_POLICY_NAME = f"{PROJECT}-add-void"
# The guard's fourth policy: on a hidden node, the operator switches hidden-gpu holds off stay off.
NODE_SWITCHES_POLICY_NAME = f"{PROJECT}-node-switches"
# The guard's third policy: which DeviceClasses tenants' ResourceClaims and ResourceClaimTemplates may name.
CLAIMS_POLICY_NAME = f"{PROJECT}-claims"
QUOTA_NAME = f"{PROJECT}-quota"
DEFAULT_PLUGIN_NAMESPACE = f"{PROJECT}-system"
DEFAULT_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
# The plugin's image also carries gpu-feature-discovery: the pinned GFD runs from it, as the operator's GFD runs from
# k8s-device-plugin (gpu-operator@v0.0.0-20250917190837-d73a0086a6ba deployments/gpu-operator/values.yaml:326-330).
GFD_COMMAND = "gpu-feature-discovery"
# What that operator commit runs as dcgm-exporter (values.yaml:286-290).
DEFAULT_DCGM_EXPORTER_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter:4.3.1-4.4.0-ubuntu22.04"
DCGM_EXPORTER_PORT = 9400
# One sign by which the policy pack recognises a device plugin (with its label and its kubelet mount).
PLUGIN_IMAGE_NAME = "k8s-device-plugin"
OPERATOR_NAMESPACE = "gpu-operator"
DEFAULT_EXEMPT_NAMESPACES = ("kube-system", OPERATOR_NAMESPACE)
# Namespaces the cluster or the GPU Operator owns: hidden-gpu never creates (or deletes) them.
CLUSTER_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease", OPERATOR_NAMESPACE)
DEFAULT_CLUSTER_POLICY = "cluster-policy"
# The GPU Operator's ClusterPolicies (one per cluster): where none exists, no operator deploys anything.
CLUSTER_POLICIES_PATH = "/apis/nvidia.com/v1/clusterpolicies"
PLUGIN_CONFIG_KEY = "config.yaml"
PLUGIN_PRIORITY_CLASS = "system-node-critical"
# Every RuntimeClass this program creates starts so: it keeps clear of the operator's names, and
# lets the access guard recognise ours without listing every node.
RUNTIME_CLASS_PREFIX = f"{PROJECT}-"
# RuntimeClasses the GPU Operator creates and owns: never create or take over these.
OPERATOR_RUNTIME_CLASSES = ("nvidia", "nvidia-cdi", "nvidia-legacy")
# The GPU Operator installs the nvidia runtime under this containerd handler name.
NVIDIA_RUNTIME_HANDLER = "nvidia"


STACK_RECORD_PREFIX = f"{PROJECT}-stack-"
# The record's data: the stack's name under STACK_RECORD_KEY, and `node.<name>` = the node's exposed
# UUIDs, comma-separated; never a hidden UUID.
STACK_RECORD_KEY = "stack"
RECORD_NODE_PREFIX = "node."


def stack_record_name(stack: str) -> str:
    """A DNS-1123 name for a Pulumi stack name (letters, digits, `-`, `_`, `.`)."""
    return STACK_RECORD_PREFIX + stack.lower().replace("_", "-").strip(".-")


def device_plugin_name(node_name: str) -> str:
    return f"{PLUGIN_NAME}-{node_name}"


def plugin_config_name(node_name: str) -> str:
    return f"{device_plugin_name(node_name)}-config"


def runtime_class_name(node_name: str) -> str:
    return f"{RUNTIME_CLASS_PREFIX}{node_name}"


# A pool's RuntimeClass; node names may not start with "pool-", so the two never collide.
POOL_CLASS_INFIX = "pool-"


def pool_class_name(pool: str) -> str:
    return f"{RUNTIME_CLASS_PREFIX}{POOL_CLASS_INFIX}{pool}"


def plugin_labels(node_name: str, name: str = PLUGIN_NAME) -> dict[str, str]:
    """The labels of the DaemonSet `name` runs on this node (the plugin, or a pinned operand) and of its pods."""
    return {PLUGIN_NAME_LABEL: name, INSTANCE_LABEL: node_name, PART_OF_LABEL: PART_OF}


def pinned_operand_name(operand: str, node_name: str) -> str:
    """The DaemonSet of a pinned operand (a PINNED_OPERANDS value) on this node."""
    return f"{operand}-{node_name}"


# --- Environment variables the NVIDIA stack reads ---

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
# Values of NVIDIA_VISIBLE_DEVICES that select no GPU (the toolkit's devices.go: void, none).
NO_GPU_VALUES = ("void", "none")
# Capability names that grant SYS_ADMIN, which the NVIDIA toolkit treats as privileged.
SYS_ADMIN_CAPABILITIES = ("SYS_ADMIN", "CAP_SYS_ADMIN", "ALL")
# What Pod Security `baseline` lets a container add: the guard's default allow-list.
BASELINE_CAPABILITIES = (
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
)
# Resources NVIDIA's device plugin advertises: nvidia.com/gpu, nvidia.com/gpu.shared (time-slicing
# with renameByDefault), nvidia.com/mig-<profile> (MIG mixed).
NVIDIA_RESOURCE_PATTERN = r"^nvidia\.com/(gpu|gpu\..+|mig-.+)$"
# Variables that make the toolkit add node-wide devices (NVSwitch, InfiniBand, GDS, GDRCopy, IMEX
# channels) to a container that sees any GPU: nvidia-container-toolkit v1.20.0
# internal/modifier/cdi.go:133-145 (`=enabled`), internal/config/image/envvars.go:23.
TOOLKIT_FEATURE_ENV = ("NVIDIA_GDS", "NVIDIA_GDRCOPY", "NVIDIA_IMEX_CHANNELS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH")
# Every variable by which a container could pick devices past the device plugin.
DEVICE_ENV = (VISIBLE_DEVICES_ENV, *TOOLKIT_FEATURE_ENV)
# What `kubectl debug` (1.36+, profile `general`) adds to its ephemeral container: ptrace inside the
# pod's own process namespace reaches nothing an `exec` into the target could not.
DEBUG_CAPABILITIES = ("SYS_PTRACE",)
# The pod fields that share a host namespace: hostPID reaches other tenants' and the partner's
# processes (and their open /dev/nvidia* files), hostNetwork host-local GPU services.
HOST_NAMESPACE_FIELDS = ("hostIPC", "hostNetwork", "hostPID")
# A "." or ".." path segment: paths holding one are not in the normal form filepath.Clean leaves.
DOT_SEGMENT_PATTERN = r"/\.\.?(/|$)"
# A ".." segment: what the guard cannot resolve without the container's file system.
PARENT_SEGMENT_PATTERN = r"/\.\.(/|$)"
# CDI device requests by pod annotation: the toolkit reads `cdi.k8s.io/<name>` where a runtime's pod-annotation
# passthrough puts it in the OCI spec (docs/security.md); the toolkit's NRI plugin reads
# `nvidia.cdi.k8s.io/container.<name>`, `nvidia.cdi.k8s.io/pod` and the bare key `nvidia.cdi.k8s.io` (NRI's
# GetEffectiveAnnotation falls back to the key itself): the whole domain, with or without a path, is refused.
CDI_ANNOTATION_DOMAIN = "cdi.k8s.io"
CDI_ANNOTATION_PATTERN = r"^([^/]*\.)?cdi\.k8s\.io(/|$)"
# DRA extended resources (KEP-5004; DRAExtendedResource beta and on from Kubernetes 1.36): every
# DeviceClass answers a container request for `deviceclass.resource.kubernetes.io/<class>`; the
# scheduler allocates it through DRA and the kubelet hands the claim's CDI devices to the runtime
# (kubernetes v1.36.3 pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go,
# pkg/kubelet/lifecycle/predicate.go removeMissingExtendedResources, pkg/kubelet/cm/dra/manager.go).
DRA_EXTENDED_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"

# --- Dynamic Resource Allocation ---

DRA_GROUP = "resource.k8s.io"
DRA_VERSION = "v1"
DRA_API_PATH = f"/apis/{DRA_GROUP}/{DRA_VERSION}"  # the REST path of its objects
# NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu v0.4.0): its driver name, the attribute that carries a device's
# UUID (a full GPU's, or a MIG device's own), and the DeviceClasses its chart creates, each selecting every device
# the driver publishes of its kind, hidden GPUs included (deployments/helm/dra-driver-nvidia-gpu/templates/
# deviceclass-*.yaml). A class whose name ends in this domain is the vendor's, never a tenant's to use here.
NVIDIA_DRA_DRIVER = "gpu.nvidia.com"
DRA_UUID_ATTRIBUTE = "uuid"
NVIDIA_CLASS_DOMAIN = "nvidia.com"
# Per class, the ResourceQuota key that counts the devices claims of it allocate (kubernetes v1.36.3
# pkg/quota/v1/evaluator/core/resource_claims.go); no `requests.` prefix.
DRA_QUOTA_SUFFIX = ".deviceclass.resource.k8s.io/devices"


def dra_quota_key(device_class: str) -> str:
    return f"{device_class}{DRA_QUOTA_SUFFIX}"


# NVIDIA's DRA kubelet plugin as hidden-gpu pins it to a DRA node (desired/dra_plugin.py; dra-driver-nvidia-gpu
# v0.4.1: its chart's image, values.yaml:60, health port, :287; its command; the gates pinned off,
# pkg/featuregates/featuregates.go:87-151, all alpha and off by default there).
DEFAULT_DRA_PLUGIN_IMAGE = "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1"
DRA_PLUGIN_COMMAND = "gpu-kubelet-plugin"
DRA_PLUGIN_NAME = "nvidia-dra-kubelet-plugin"
DRA_HEALTH_PORT = 51516
DRA_OFF_FEATURE_GATES = ("MPSSupport", "TimeSlicingSettings", "PassthroughSupport", "DynamicMIG")
# Its image's names, old and new, by which cluster.verify knows NVIDIA's own plugin (the chart's) on a stack node.
DRA_PLUGIN_IMAGE_NAMES = ("dra-driver-nvidia-gpu", "k8s-dra-driver-gpu", "k8s-dra-driver")
# What it reads and writes of the API: the chart's ClusterRole (templates/rbac-kubeletplugin.yaml:7-22) less compute
# domains, which this plugin does not serve, and less `update` of nodes, which only they use. The policy pack allows
# a stack no other ClusterRole.
DRA_PLUGIN_RULES = (
    ("resource.k8s.io", "resourceslices", ("get", "list", "watch", "create", "update", "delete")),
    ("resource.k8s.io", "resourceclaims", ("get", "list", "watch")),
    ("", "nodes", ("get", "list", "watch")),
    ("", "pods", ("get", "list", "watch")),
)
KUBELET_PLUGINS_REGISTRY = "/var/lib/kubelet/plugins_registry"
KUBELET_PLUGINS = "/var/lib/kubelet/plugins"


def dra_plugin_name(node_name: str) -> str:
    """The node's pinned DRA kubelet plugin: its DaemonSet, ServiceAccount, ClusterRole and binding."""
    return f"hidden-gpu-{DRA_PLUGIN_NAME}-{node_name}"


# --- Host paths ---

KUBELET_DEVICE_PLUGINS = "/var/lib/kubelet/device-plugins"
# The toolkit reads a container's device requests from mounts below this path.
DEVICE_REQUEST_DIR = "/var/run/nvidia-container-devices"
PLUGIN_CONFIG_DIR = "/etc/nvidia-device-plugin"
PLUGIN_CONFIG_FILE = f"{PLUGIN_CONFIG_DIR}/{PLUGIN_CONFIG_KEY}"
# Where GPU Feature Discovery writes its labels for NFD's worker to publish (the operator's GFD mounts it so).
NFD_FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
# The kubelet's PodResources socket directory: dcgm-exporter maps GPUs to pods through it.
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
# Where CDI specs live on the host, and where the plugin sees the driver root (its Helm chart's mounts).
CDI_SPEC_DIR = "/var/run/cdi"
CONTAINER_DRIVER_ROOT = "/driver-root"
DEV_NULL = "/dev/null"
# Host paths no stack may let tenants mount, nor any path above or below one: devices, the kernel's
# views, runtime and kubelet sockets (a read-only bind mount still lets a process connect to a
# unix socket), static pod manifests, CDI specs and the toolkit's config.
PROTECTED_HOST_PATHS = (
    "/dev",
    "/etc/cdi",
    "/etc/kubernetes",
    "/etc/nvidia-container-runtime",
    "/proc",
    "/run",
    "/sys",
    "/var/lib/containerd",
    "/var/lib/kubelet",
    "/var/run",
)
