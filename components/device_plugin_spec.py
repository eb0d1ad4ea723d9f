"""The pinned device plugin's DaemonSet spec, from a validated node and the stack's plugin settings: plain
Kubernetes arguments, no resource (HiddenGpuNode declares the DaemonSet and its ConfigMap from these)."""

from __future__ import annotations

import hashlib

import pulumi
import pulumi_kubernetes as k8s
import yaml

from common.names import (
    CDI_SPEC_DIR,
    CONFIG_CHECKSUM_ANNOTATION,
    CONTAINER_DRIVER_ROOT,
    FIELD_MANAGER,
    FIELD_MANAGER_ANNOTATION,
    GPU_RESOURCE,
    KUBELET_DEVICE_PLUGINS,
    NO_GPU_VALUES,
    NODE_LABEL,
    PATCH_FORCE_ANNOTATION,
    PLUGIN_CONFIG_FILE,
    PLUGIN_NAME,
    PLUGIN_SOCKET_GLOB,
    PLUGIN_WAIT_CONTAINER,
    VISIBLE_DEVICES_ENV,
    DeviceListStrategy,
    MigStrategy,
    device_plugin_name,
    plugin_labels,
)
from components.inputs import derive
from components.node_pods import device_requests, node_pod_spec, plugin_config_volume, scan_exceptions, unprivileged
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


def env(node: NodeConfig, plugin: DevicePluginConfig, config: str | None) -> list[k8s.core.v1.EnvVarArgs]:
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


def security_context(node: NodeConfig) -> k8s.core.v1.SecurityContextArgs:
    # MIG is the one exception to "no capabilities": the toolkit mounts the MIG monitor
    # capability that NVIDIA_MIG_MONITOR_DEVICES asks for only into a container with SYS_ADMIN,
    # which it then treats as privileged: the variable is honoured whatever the toolkit's
    # unprivileged settings say. The plugin still sees only the GPUs it names (and every MIG
    # device of those GPUs, hence the config's split rule); tenants' SYS_ADMIN stays denied by
    # the access guard, which exempts only the plugin's namespace.
    return unprivileged(["SYS_ADMIN"] if node.mig_strategy != MigStrategy.NONE else None)


def volumes(
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


def resources(plugin: DevicePluginConfig) -> k8s.core.v1.ResourceRequirementsArgs:
    """The plugin settings' requests and limits, for each container of the plugin's pod."""
    return k8s.core.v1.ResourceRequirementsArgs(
        requests=plugin.resources.requests.model_dump(), limits=plugin.resources.limits.model_dump()
    )


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


def wait_for_other_plugins(plugin: DevicePluginConfig) -> k8s.core.v1.ContainerArgs:
    """The plugin it replaces (the GPU Operator's, a hand-made one) stops on its own controller's time, not ours: the
    pinned plugin must register only after the other's server stopped. Two plugins of one socket leave the kubelet
    with no healthy GPU (v1.36) or refusing every plugin of it until it restarts (v1.37; docs/operations.md). The
    plugin's own image, no GPU (`void`), the directory read-only."""
    return k8s.core.v1.ContainerArgs(
        name=PLUGIN_WAIT_CONTAINER,
        image=plugin.image,
        image_pull_policy="IfNotPresent",
        command=["/bin/sh", "-c", WAIT_SCRIPT],
        env=[k8s.core.v1.EnvVarArgs(name=VISIBLE_DEVICES_ENV, value=NO_GPU_VALUES[0])],
        security_context=unprivileged(),
        resources=resources(plugin),
        volume_mounts=[
            k8s.core.v1.VolumeMountArgs(name="device-plugin", mount_path=KUBELET_DEVICE_PLUGINS, read_only=True)
        ],
    )


def plugin_spec(
    node: NodeConfig, plugin: DevicePluginConfig, runtime_class: pulumi.Input[str]
) -> k8s.apps.v1.DaemonSetSpecArgs:
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
    container = k8s.core.v1.ContainerArgs(
        name=PLUGIN_NAME if adopt is None or adopt.container is None else adopt.container,
        image=plugin.image,
        image_pull_policy="IfNotPresent",
        env=env(node, plugin, config),
        security_context=security_context(node),
        resources=resources(plugin),
        volume_mounts=mounts,
    )
    waits = [wait_for_other_plugins(plugin)]
    pod_spec = node_pod_spec(node.name, plugin, runtime_class, [container], volumes_, init_containers=waits)
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


def plugin_namespace_of(adopt: AdoptedPluginConfig | None, plugin_namespace: pulumi.Input[str]) -> pulumi.Input[str]:
    """An adopted plugin stays where it was made (a DaemonSet cannot move), its config beside it."""
    return plugin_namespace if adopt is None else adopt.namespace


def plugin_name(name: str, adopt: AdoptedPluginConfig | None) -> str:
    return device_plugin_name(name) if adopt is None else adopt.name


def plugin_metadata(
    name: str | pulumi.Output[str],
    adopt: AdoptedPluginConfig | None,
    plugin: DevicePluginConfig,
    plugin_namespace: pulumi.Input[str],
) -> k8s.meta.v1.ObjectMetaArgs:
    annotations = scan_exceptions(SCAN_EXCEPTIONS, plugin.image, "devicePlugin.image")
    if adopt is not None:
        # Taking over a hand-made DaemonSet: a forced server-side apply under hidden-gpu's field manager, not
        # `pulumi import`. The provider creates by server-side apply (a PATCH, so an existing object is upserted:
        # pulumi-kubernetes v4.25 pkg/await/await.go), and patchForce takes every field this declares from the
        # hand-made manager; an import would need each object's ID in the program and a first `up` that changes
        # nothing. Fields only the hand-made manager set and this does not declare stay: cluster.verify names them.
        annotations = {**annotations, PATCH_FORCE_ANNOTATION: "true", FIELD_MANAGER_ANNOTATION: FIELD_MANAGER}
    return k8s.meta.v1.ObjectMetaArgs(
        name=derive(name, lambda known: plugin_name(known, adopt)),
        namespace=plugin_namespace_of(adopt, plugin_namespace),
        labels=derive(name, plugin_labels),
        annotations=annotations,
    )
