"""The GPU Operator's operands that read GPUs, run by hidden-gpu pinned to a node's exposed GPUs: GPU Feature
Discovery (the node's `nvidia.com/gpu.*` labels) and dcgm-exporter (GPU metrics). As the plugin is: one DaemonSet per
node, that node alone, under its RuntimeClass, unprivileged with every capability dropped, `NVIDIA_VISIBLE_DEVICES` =
the exposed UUIDs, so NVML in the container sees those GPUs alone and no label or series names a hidden one. The
operator's own run privileged and read every GPU: hidden-gpu holds them off the node (node_labels.operator_labels).

Read upstream, not run here (no registry serves NVIDIA's images; tests/node runs stand-ins in their place):
k8s-device-plugin v0.20.0 (GFD's flags: cmd/gpu-feature-discovery/main.go:52-105) and dcgm-exporter 4.3.1-4.4.0
(pkg/cmd/app.go:117-144, internal/pkg/server/server.go:93-94, 269-276)."""

from __future__ import annotations

from common.names import (
    DCGM_EXPORTER_PORT,
    GFD_COMMAND,
    NFD_FEATURES_DIR,
    PINNED_OPERANDS,
    PLUGIN_CONFIG_FILE,
    POD_RESOURCES_DIR,
    VISIBLE_DEVICES_ENV,
    pinned_operand_name,
    plugin_labels,
)
from desired import pods
from desired.pods import Object
from stack_config.node_config import NodeConfig
from stack_config.plugin_config import DevicePluginConfig

GFD = PINNED_OPERANDS["gpu_feature_discovery"]
DCGM_EXPORTER = PINNED_OPERANDS["dcgm_exporter"]
NO_LIMITS = "the GPU Operator runs it with no requests or limits (values.yaml resources: {}): none is guessed here"
# dcgm-exporter 4.3.1-4.4.0 internal/pkg/server/server.go:269-276.
PROBE_TELLS_NOTHING = (
    "dcgm-exporter's /health answers 200 whatever DCGM's state; the operator's exporter runs without probes"
)
# DCGM v4.3.1 dcgmlib/src/DcgmCacheManager.cpp:743-747, 2789-2790.
NEEDS_ROOT = "DCGM needs euid 0 to turn on accounting and to read MIG devices; root without capabilities here"
# Checks of the security scan (make scan) each operand deliberately does not meet.
SCAN_EXCEPTIONS = {
    GFD: {
        "CKV_K8S_8": "GPU Feature Discovery writes a file and serves nothing: it has no endpoint to probe",
        "CKV_K8S_9": "GPU Feature Discovery writes a file and serves nothing: it has no endpoint to probe",
        "CKV_K8S_10": NO_LIMITS,
        "CKV_K8S_11": NO_LIMITS,
        "CKV_K8S_12": NO_LIMITS,
        "CKV_K8S_13": NO_LIMITS,
        "CKV_K8S_22": "NVIDIA's image is not known to run with a read-only root here; not yet tried on a GPU node",
        "CKV_K8S_23": "it writes NFD's features file in the root-owned /etc/kubernetes/node-feature-discovery",
        "CKV_K8S_40": "it writes NFD's features file in the root-owned /etc/kubernetes/node-feature-discovery",
        "CKV_K8S_15": "the image is pinned; Always would make a restart depend on the registry",
    },
    DCGM_EXPORTER: {
        "CKV_K8S_8": PROBE_TELLS_NOTHING,
        "CKV_K8S_9": PROBE_TELLS_NOTHING,
        "CKV_K8S_10": NO_LIMITS,
        "CKV_K8S_11": NO_LIMITS,
        "CKV_K8S_12": NO_LIMITS,
        "CKV_K8S_13": NO_LIMITS,
        "CKV_K8S_22": "the image's entrypoint runs ldconfig, which writes /etc/ld.so.cache",
        "CKV_K8S_23": NEEDS_ROOT,
        "CKV_K8S_40": NEEDS_ROOT,
        "CKV_K8S_15": "the image is pinned; Always would make a restart depend on the registry",
    },
}
IMAGE_KEYS = {GFD: "devicePlugin.image", DCGM_EXPORTER: "devicePlugin.dcgmExporterImage"}


def image_of(operand: str, plugin: DevicePluginConfig) -> str:
    """GPU Feature Discovery runs from the plugin's image, which carries it; dcgm-exporter from its own."""
    return plugin.image if operand == GFD else plugin.dcgm_exporter_image


def operand_metadata(operand: str, node_name: str, plugin: DevicePluginConfig, namespace: object) -> Object:
    """The operand's DaemonSet on this node (a PINNED_OPERANDS value), named `<operand>-<node>`; `namespace` placed
    as given."""
    return {
        "name": pinned_operand_name(operand, node_name),
        "namespace": namespace,
        "labels": plugin_labels(node_name, operand),
        "annotations": pods.scan_exceptions(SCAN_EXCEPTIONS[operand], image_of(operand, plugin), IMAGE_KEYS[operand]),
    }


def operand_spec(operand: str, node: NodeConfig, plugin: DevicePluginConfig, runtime_class: object) -> Object:
    labels = plugin_labels(node.name, operand)
    container, volumes = (_gfd if operand == GFD else _dcgm_exporter)(node, plugin)
    # Scraped as the operator's exporter is (its Service's prometheus.io/scrape), by pod here: one per node.
    annotations = (
        {"prometheus.io/scrape": "true", "prometheus.io/port": str(DCGM_EXPORTER_PORT)}
        if operand == DCGM_EXPORTER
        else None
    )
    pod_spec = pods.node_pod_spec(node.name, plugin, runtime_class, [container], volumes)
    return pods.daemon_set_spec(labels, pod_spec, annotations=annotations)


def _env(node: NodeConfig, more: dict[str, str]) -> list[Object]:
    # NVIDIA_VISIBLE_DEVICES also overrides the images' own `ENV NVIDIA_VISIBLE_DEVICES=all`.
    return [
        *pods.env_vars({VISIBLE_DEVICES_ENV: ",".join(node.exposed_gpus), **more}),
        pods.downward("NODE_NAME", "spec.nodeName"),
    ]


def _gfd(node: NodeConfig, plugin: DevicePluginConfig) -> tuple[Object, list[Object]]:
    # The features file NFD's worker publishes as the node's labels, as the operator's GFD writes it; v0.20.0 would
    # write NodeFeature objects by default, which needs an API token this pod does not get.
    env = {"GFD_USE_NODE_FEATURE_API": "false", "GFD_SLEEP_INTERVAL": "60s", "GFD_FAIL_ON_INIT_ERROR": "true"}
    volumes = [pods.host_path("output-dir", NFD_FEATURES_DIR, "DirectoryOrCreate")]
    mounts = [pods.mount("output-dir", NFD_FEATURES_DIR)]
    if node.time_slicing is not None:
        # The plugin's config, so `gpu.replicas` and `gpu.sharing-strategy` say what the plugin advertises.
        env["CONFIG_FILE"] = PLUGIN_CONFIG_FILE
        volume, config_mount = pods.plugin_config_volume(node.name)
        volumes.append(volume)
        mounts.append(config_mount)
    container = {
        "name": GFD,
        "image": plugin.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [GFD_COMMAND],
        "env": _env(node, env),
        "securityContext": pods.unprivileged(),
        "volumeMounts": mounts,
    }
    return container, volumes


def _dcgm_exporter(node: NodeConfig, plugin: DevicePluginConfig) -> tuple[Object, list[Object]]:
    # DCGM embedded in the exporter (no DCGM_REMOTE_HOSTENGINE_INFO): the operator's standalone host engine reads
    # every GPU. Pods are named per GPU through the kubelet's PodResources socket, read-only.
    env = {"DCGM_EXPORTER_LISTEN": f":{DCGM_EXPORTER_PORT}", "DCGM_EXPORTER_KUBERNETES": "true"}
    container = {
        "name": DCGM_EXPORTER,
        "image": plugin.dcgm_exporter_image,
        "imagePullPolicy": "IfNotPresent",
        "env": _env(node, env),
        "ports": [{"name": "metrics", "containerPort": DCGM_EXPORTER_PORT}],
        "securityContext": pods.unprivileged(),
        "volumeMounts": [pods.mount("pod-resources", POD_RESOURCES_DIR, read_only=True)],
    }
    return container, [pods.host_path("pod-resources", POD_RESOURCES_DIR, "Directory")]


def operand_objects(operand: str, node: NodeConfig, plugin: DevicePluginConfig) -> list[Object]:
    """The operand's DaemonSet on the node, whole, in the stack's own namespace and RuntimeClass: what cluster.verify
    compares the live one with."""
    metadata = operand_metadata(operand, node.name, plugin, plugin.namespace)
    spec = operand_spec(operand, node, plugin, node.class_name)
    return [{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": metadata, "spec": spec}]
