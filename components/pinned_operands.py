"""The GPU Operator's operands that read GPUs, run by hidden-gpu pinned to a node's exposed GPUs: GPU Feature
Discovery (the node's `nvidia.com/gpu.*` labels) and dcgm-exporter (GPU metrics). As the plugin is: one DaemonSet per
node, that node alone, under its RuntimeClass, unprivileged with every capability dropped, `NVIDIA_VISIBLE_DEVICES` =
the exposed UUIDs, so NVML in the container sees those GPUs alone and no label or series names a hidden one. The
operator's own run privileged and read every GPU: hidden-gpu holds them off the node (node_labels.operator_labels).

Read upstream, not run here (no registry serves NVIDIA's images; tests/node runs stand-ins in their place):
k8s-device-plugin v0.20.0 (GFD's flags: cmd/gpu-feature-discovery/main.go:52-105) and dcgm-exporter 4.3.1-4.4.0
(pkg/cmd/app.go:117-144, internal/pkg/server/server.go:93-94, 269-276)."""

# No `from __future__ import annotations`: the components beside it are read by Pulumi's analyzer.
import pulumi
import pulumi_kubernetes as k8s

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
from components.inputs import derive
from components.node_pods import downward, node_pod_spec, plugin_config_volume, scan_exceptions, unprivileged
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


def pinned_operand(
    prefix: str,
    operand: str,
    node_name: str | pulumi.Output[str],
    node: NodeConfig | pulumi.Output[NodeConfig],
    plugin: DevicePluginConfig,
    *,
    namespace: pulumi.Input[str],
    runtime_class: pulumi.Input[str],
    opts: pulumi.ResourceOptions,
) -> k8s.apps.v1.DaemonSet:
    """The operand's DaemonSet on this node (a PINNED_OPERANDS value), named `<operand>-<node>`."""
    image = image_of(operand, plugin)
    return k8s.apps.v1.DaemonSet(
        f"{prefix}-{operand}",
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=derive(node_name, lambda name: pinned_operand_name(operand, name)),
            namespace=namespace,
            labels=derive(node_name, lambda name: plugin_labels(name, operand)),
            annotations=scan_exceptions(SCAN_EXCEPTIONS[operand], image, IMAGE_KEYS[operand]),
        ),
        spec=derive(node, lambda n: _spec(operand, n, plugin, runtime_class)),
        opts=opts,
    )


def _spec(
    operand: str, node: NodeConfig, plugin: DevicePluginConfig, runtime_class: pulumi.Input[str]
) -> k8s.apps.v1.DaemonSetSpecArgs:
    labels = plugin_labels(node.name, operand)
    container, volumes = (_gfd if operand == GFD else _dcgm_exporter)(node, plugin)
    # Scraped as the operator's exporter is (its Service's prometheus.io/scrape), by pod here: one per node.
    annotations = (
        {"prometheus.io/scrape": "true", "prometheus.io/port": str(DCGM_EXPORTER_PORT)}
        if operand == DCGM_EXPORTER
        else None
    )
    return k8s.apps.v1.DaemonSetSpecArgs(
        selector=k8s.meta.v1.LabelSelectorArgs(match_labels=labels),
        template=k8s.core.v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(labels=labels, annotations=annotations),
            spec=node_pod_spec(node.name, plugin, runtime_class, [container], volumes),
        ),
    )


def _env(node: NodeConfig, more: dict[str, str]) -> list[k8s.core.v1.EnvVarArgs]:
    # NVIDIA_VISIBLE_DEVICES also overrides the images' own `ENV NVIDIA_VISIBLE_DEVICES=all`.
    env = [k8s.core.v1.EnvVarArgs(name=VISIBLE_DEVICES_ENV, value=",".join(node.exposed_gpus))]
    env += [k8s.core.v1.EnvVarArgs(name=name, value=value) for name, value in more.items()]
    return [*env, downward("NODE_NAME", "spec.nodeName")]


def _gfd(
    node: NodeConfig, plugin: DevicePluginConfig
) -> tuple[k8s.core.v1.ContainerArgs, list[k8s.core.v1.VolumeArgs]]:
    # The features file NFD's worker publishes as the node's labels, as the operator's GFD writes it; v0.20.0 would
    # write NodeFeature objects by default, which needs an API token this pod does not get.
    env = {"GFD_USE_NODE_FEATURE_API": "false", "GFD_SLEEP_INTERVAL": "60s", "GFD_FAIL_ON_INIT_ERROR": "true"}
    volumes = [
        k8s.core.v1.VolumeArgs(
            name="output-dir",
            host_path=k8s.core.v1.HostPathVolumeSourceArgs(path=NFD_FEATURES_DIR, type="DirectoryOrCreate"),
        )
    ]
    mounts = [k8s.core.v1.VolumeMountArgs(name="output-dir", mount_path=NFD_FEATURES_DIR)]
    if node.time_slicing is not None:
        # The plugin's config, so `gpu.replicas` and `gpu.sharing-strategy` say what the plugin advertises.
        env["CONFIG_FILE"] = PLUGIN_CONFIG_FILE
        volume, mount = plugin_config_volume(node.name)
        volumes.append(volume)
        mounts.append(mount)
    container = k8s.core.v1.ContainerArgs(
        name=GFD,
        image=plugin.image,
        image_pull_policy="IfNotPresent",
        command=[GFD_COMMAND],
        env=_env(node, env),
        security_context=unprivileged(),
        volume_mounts=mounts,
    )
    return container, volumes


def _dcgm_exporter(
    node: NodeConfig, plugin: DevicePluginConfig
) -> tuple[k8s.core.v1.ContainerArgs, list[k8s.core.v1.VolumeArgs]]:
    # DCGM embedded in the exporter (no DCGM_REMOTE_HOSTENGINE_INFO): the operator's standalone host engine reads
    # every GPU. Pods are named per GPU through the kubelet's PodResources socket, read-only.
    env = {"DCGM_EXPORTER_LISTEN": f":{DCGM_EXPORTER_PORT}", "DCGM_EXPORTER_KUBERNETES": "true"}
    container = k8s.core.v1.ContainerArgs(
        name=DCGM_EXPORTER,
        image=plugin.dcgm_exporter_image,
        image_pull_policy="IfNotPresent",
        env=_env(node, env),
        ports=[k8s.core.v1.ContainerPortArgs(name="metrics", container_port=DCGM_EXPORTER_PORT)],
        security_context=unprivileged(),
        volume_mounts=[k8s.core.v1.VolumeMountArgs(name="pod-resources", mount_path=POD_RESOURCES_DIR, read_only=True)],
    )
    volumes = [
        k8s.core.v1.VolumeArgs(
            name="pod-resources",
            host_path=k8s.core.v1.HostPathVolumeSourceArgs(path=POD_RESOURCES_DIR, type="Directory"),
        )
    ]
    return container, volumes
