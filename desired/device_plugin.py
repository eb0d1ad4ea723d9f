"""The pinned device plugin of one node as plain Kubernetes objects: its DaemonSet and, where the node time-slices, its
ConfigMap (HiddenGpuNode declares them; cluster.verify compares the live ones with them)."""

from __future__ import annotations

import hashlib

import yaml

from common.names import (
    CDI_SPEC_DIR,
    CONFIG_CHECKSUM_ANNOTATION,
    CONTAINER_DRIVER_ROOT,
    GPU_RESOURCE,
    KUBELET_DEVICE_PLUGINS,
    NO_GPU_VALUES,
    NODE_LABEL,
    PLUGIN_CONFIG_FILE,
    PLUGIN_CONFIG_KEY,
    PLUGIN_NAME,
    PLUGIN_SOCKET_GLOB,
    PLUGIN_WAIT_CONTAINER,
    VISIBLE_DEVICES_ENV,
    DeviceListStrategy,
    MigStrategy,
    device_plugin_name,
    plugin_config_name,
    plugin_labels,
)
from desired.pods import (
    TAKEN_BACK,
    Object,
    daemon_set_spec,
    device_requests,
    env_vars,
    fields,
    host_path,
    mount,
    node_pod_spec,
    plugin_config_volume,
    scan_exceptions,
    unprivileged,
)
from stack_config.node_config import AdoptedPluginConfig, NodeConfig
from stack_config.plugin_config import DevicePluginConfig

# Checks of the security scan (make scan) that the plugin deliberately does not meet.
SCAN_EXCEPTIONS = {
    "CKV_K8S_8": "the plugin serves gRPC on a kubelet unix socket only; it has no endpoint to probe",
    "CKV_K8S_9": "the plugin serves gRPC on a kubelet unix socket only; it has no endpoint to probe",
    "CKV_K8S_22": "the upstream manifest runs the plugin with a writable root; read-only not yet tried on a node",
    "CKV_K8S_23": "the plugin must create its socket in the root-owned /var/lib/kubelet/device-plugins",
    "CKV_K8S_40": "the plugin must create its socket in the root-owned /var/lib/kubelet/device-plugins",
    "CKV_K8S_15": "the image is pinned; Always would make a plugin restart depend on the registry",
}


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


def env(node: NodeConfig, plugin: DevicePluginConfig, config: str | None) -> list[Object]:
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
    return env_vars(env)


def added_capabilities(node: NodeConfig) -> list[str]:
    """MIG is the one exception to "no capabilities": the toolkit mounts the MIG monitor capability that
    NVIDIA_MIG_MONITOR_DEVICES asks for only into a container with SYS_ADMIN, which it then treats as privileged: the
    variable is honoured whatever the toolkit's unprivileged settings say. The plugin still sees only the GPUs it names
    (and every MIG device of those GPUs, hence the config's split rule); tenants' SYS_ADMIN stays denied by the access
    guard, which exempts only the plugin's namespace."""
    return ["SYS_ADMIN"] if node.mig_strategy != MigStrategy.NONE else []


def volumes(node: NodeConfig, plugin: DevicePluginConfig, config: str | None) -> tuple[list[Object], list[Object]]:
    volumes = [host_path("device-plugin", KUBELET_DEVICE_PLUGINS, "Directory")]
    mounts = [mount("device-plugin", KUBELET_DEVICE_PLUGINS)]
    if config is not None:
        volume, config_mount = plugin_config_volume(node.name)
        volumes.append(volume)
        mounts.append(config_mount)
    requests, request_mounts = device_requests(node, plugin)
    volumes += requests
    mounts += request_mounts
    if plugin.device_list_strategy == DeviceListStrategy.CDI_CRI:
        volumes += [
            host_path("driver-root", plugin.nvidia_driver_root, "Directory"),
            host_path("cdi-root", CDI_SPEC_DIR, "DirectoryOrCreate"),
        ]
        mounts += [mount("driver-root", CONTAINER_DRIVER_ROOT, read_only=True), mount("cdi-root", CDI_SPEC_DIR)]
    return volumes, mounts


def resources(plugin: DevicePluginConfig) -> Object:
    """The plugin settings' requests and limits, for each container of the plugin's pod."""
    return {"limits": plugin.resources.limits.model_dump(), "requests": plugin.resources.requests.model_dump()}


# Said once the wait starts: what holds the socket, and what to do.
WAITING = (
    "another NVIDIA device plugin still serves this node, as while the GPU Operator's or a hand-made one stops; if "
    f"it stays: a hand-made DaemonSet lacks the node-affinity term '{NODE_LABEL} DoesNotExist' (docs/operations.md: "
    "Adopting a hand-made setup), or, with no other plugin pod on this node, a killed plugin left the file: delete it"
)
# POSIX sh (busybox's in NVIDIA's image from v0.18.0, deployments/container/Dockerfile:46-60 at v0.20.0), with no
# `$(`, which the kubelet would read as a variable reference. A line at once, then every 30 s.
WAIT_SCRIPT = f"""d={KUBELET_DEVICE_PLUGINS}
t=
while :; do
  set -- "$d"/{PLUGIN_SOCKET_GLOB}
  if [ ! -e "$1" ]; then echo "hidden-gpu: no other NVIDIA plugin socket in $d: the pinned plugin starts"; exit 0; fi
  if [ -z "$t" ]; then echo "hidden-gpu: waiting for $1 to go: {WAITING}"; fi
  t="${{t}}x"; [ ${{#t}} -ge 30 ] && t=
  sleep 1
done
"""


def wait_for_other_plugins(plugin: DevicePluginConfig) -> Object:
    """The plugin it replaces (the GPU Operator's, a hand-made one) stops on its own controller's time, not ours: the
    pinned plugin must register only after the other's server stopped. Two plugins of one socket leave the kubelet
    with no healthy GPU (v1.36) or refusing every plugin of it until it restarts (v1.37; docs/operations.md). The
    plugin's own image, no GPU (`void`), the directory read-only."""
    return {
        "name": PLUGIN_WAIT_CONTAINER,
        "image": plugin.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", WAIT_SCRIPT],
        "env": env_vars({VISIBLE_DEVICES_ENV: NO_GPU_VALUES[0]}),
        "securityContext": unprivileged(),
        "resources": resources(plugin),
        "volumeMounts": [mount("device-plugin", KUBELET_DEVICE_PLUGINS, read_only=True)],
    }


def plugin_spec(node: NodeConfig, plugin: DevicePluginConfig, runtime_class: object) -> Object:
    """The DaemonSet's spec; `runtime_class` placed as given (a component's Output, or the name)."""
    labels = plugin_labels(node.name)
    selector, pod_labels = labels, labels
    adopt = node.taken_over_plugin
    if adopt is not None:
        # An adopted DaemonSet's selector is immutable, so it stays the hand-made one and the pods carry both its
        # labels and ours (cluster.verify finds them by ours); the container keeps its name, as containers merge by
        # name.
        selector = dict(adopt.match_labels or {})
        pod_labels = {**selector, **labels}
    config = plugin_config(node)
    volumes_, mounts = volumes(node, plugin, config)
    container = {
        "name": PLUGIN_NAME if adopt is None or adopt.container is None else adopt.container,
        "image": plugin.image,
        "imagePullPolicy": "IfNotPresent",
        "env": env(node, plugin, config),
        "securityContext": unprivileged(added_capabilities(node) or None),
        "resources": resources(plugin),
        "volumeMounts": mounts,
    }
    waits = [wait_for_other_plugins(plugin)]
    pod_spec = node_pod_spec(node.name, plugin, runtime_class, [container], volumes_, init_containers=waits)
    checksum = {CONFIG_CHECKSUM_ANNOTATION: hashlib.sha256(config.encode()).hexdigest()} if config else None
    spec = daemon_set_spec(pod_labels, pod_spec, annotations=checksum)
    # One plugin pod at a time, stated rather than left to the default (which a hand-made DaemonSet may have
    # changed): a surge pod would register the same resource while the old one runs, and the kubelet then disconnects
    # the newer one when the older one's stream ends (every GPU unhealthy).
    rolling = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return {**spec, "selector": {"matchLabels": selector}, "updateStrategy": rolling}


def plugin_namespace_of(adopt: AdoptedPluginConfig | None, plugin_namespace: object) -> object:
    """An adopted plugin stays where it was made (a DaemonSet cannot move), its config beside it."""
    return plugin_namespace if adopt is None else adopt.namespace


def plugin_name(name: str, adopt: AdoptedPluginConfig | None) -> str:
    return device_plugin_name(name) if adopt is None else adopt.name


def plugin_metadata(
    name: str, adopt: AdoptedPluginConfig | None, plugin: DevicePluginConfig, plugin_namespace: object
) -> Object:
    """The DaemonSet's metadata: `plugin_namespace` placed as given, unless the plugin is adopted."""
    annotations = scan_exceptions(SCAN_EXCEPTIONS, plugin.image, "devicePlugin.image")
    if adopt is not None:
        # Taking over a hand-made DaemonSet: a forced server-side apply under hidden-gpu's field manager, not
        # `pulumi import`. The provider creates by server-side apply (a PATCH, so an existing object is upserted:
        # pulumi-kubernetes v4.25 pkg/await/await.go), and patchForce takes every field this declares from the
        # hand-made manager; an import would need each object's ID in the program and a first `up` that changes
        # nothing. Fields only the hand-made manager set and this does not declare stay: cluster.verify names them.
        annotations = {**annotations, **TAKEN_BACK}
    return {
        "name": plugin_name(name, adopt),
        "namespace": plugin_namespace_of(adopt, plugin_namespace),
        "labels": plugin_labels(name),
        "annotations": annotations,
    }


def config_map_metadata(name: str, adopt: AdoptedPluginConfig | None, plugin_namespace: object) -> Object:
    """The plugin's ConfigMap beside its DaemonSet."""
    namespace = plugin_namespace_of(adopt, plugin_namespace)
    return {"name": plugin_config_name(name), "namespace": namespace, "labels": plugin_labels(name)}


def config_data(node: NodeConfig) -> dict[str, str]:
    """The ConfigMap's data, for a time-sliced node (the only one that has a config)."""
    config = plugin_config(node)
    return {} if config is None else {PLUGIN_CONFIG_KEY: config}


def plugin_objects(node: NodeConfig, plugin: DevicePluginConfig) -> list[Object]:
    """What the stack declares for the node's plugin, whole, in the stack's own namespace and RuntimeClass: what
    cluster.verify compares the live objects with. None where the node runs no plugin."""
    if not node.runs_plugin:
        return []
    adopt = node.taken_over_plugin
    objects: list[Object] = [
        fields(
            apiVersion="apps/v1",
            kind="DaemonSet",
            metadata=plugin_metadata(node.name, adopt, plugin, plugin.namespace),
            spec=plugin_spec(node, plugin, node.class_name),
        )
    ]
    if node.time_slicing is not None:
        metadata = config_map_metadata(node.name, adopt, plugin.namespace)
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": config_data(node)})
    return objects
