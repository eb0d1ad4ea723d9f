"""NVIDIA's DRA kubelet plugin pinned to a DRA node's exposed GPUs (`nodes[].allocator: dra`): as the device plugin
is, one DaemonSet on that node alone, under its RuntimeClass, unprivileged with every capability dropped,
`NVIDIA_VISIBLE_DEVICES` = the exposed UUIDs. The plugin learns its GPUs from NVML's device count and handles alone,
and NVML in that container sees only what the toolkit injected: its ResourceSlice lists the exposed GPUs and no
hidden one (../shared/bin/README.md has what NVIDIA's plugin was seen to do on a GPU host).

What it keeps of the chart's kubelet plugin and what it leaves out (dra-driver-nvidia-gpu v0.4.1, read:
deployments/helm/dra-driver-nvidia-gpu/templates/kubeletplugin.yaml:200-371, values.yaml:60,254-321,
cmd/gpu-kubelet-plugin/main.go:88-184, pkg/featuregates/featuregates.go:87-151): the `gpus` container, its health
port and probes, its registration and plugin directories at the kubelet's paths (the CDI specs it writes name its
hook's copy there), `/var/run/cdi`; not `privileged` (which gives the container every GPU of the host), not the
Bidirectional mount of the whole plugins directory (MPS's alone), not the init container (privileged; it only waits
for the driver), not the compute-domain plugin. MPS, time-slicing, passthrough and dynamic MIG are pinned off."""

# No `from __future__ import annotations`: the components beside it are read by Pulumi's analyzer.
import pulumi
import pulumi_kubernetes as k8s

from common.names import (
    CDI_SPEC_DIR,
    CONTAINER_DRIVER_ROOT,
    DRA_HEALTH_PORT,
    DRA_OFF_FEATURE_GATES,
    DRA_PLUGIN_COMMAND,
    DRA_PLUGIN_NAME,
    DRA_PLUGIN_RULES,
    KUBELET_PLUGINS,
    KUBELET_PLUGINS_REGISTRY,
    NVIDIA_DRA_DRIVER,
    VISIBLE_DEVICES_ENV,
    dra_plugin_name,
    plugin_labels,
)
from components.inputs import derive
from components.node_pods import device_requests, downward, node_pod_spec, scan_exceptions, unprivileged
from stack_config.node_config import NodeConfig
from stack_config.plugin_config import DevicePluginConfig

# The plugin's data directory: its socket, checkpoint and the copy of nvidia-cdi-hook its CDI specs name.
PLUGIN_DIR = f"{KUBELET_PLUGINS}/{NVIDIA_DRA_DRIVER}"
# Checks of the security scan (make scan) the plugin deliberately does not meet.
NO_LIMITS = "NVIDIA's chart runs it with no requests or limits (values.yaml resources: {}): none is guessed"
SCAN_EXCEPTIONS = {
    "CKV_K8S_9": "no Service sends it traffic (the kubelet dials its socket); the chart's two probes run",
    "CKV_K8S_10": NO_LIMITS,
    "CKV_K8S_11": NO_LIMITS,
    "CKV_K8S_12": NO_LIMITS,
    "CKV_K8S_13": NO_LIMITS,
    "CKV_K8S_22": "the toolkit's CDI hooks update the container's ld.so.cache at start",
    "CKV_K8S_23": "it writes the root-owned kubelet plugin directories and /var/run/cdi; root without capabilities",
    "CKV_K8S_40": "it writes the root-owned kubelet plugin directories and /var/run/cdi; root without capabilities",
    "CKV_K8S_15": "the image is pinned; Always would make a restart depend on the registry",
    "CKV_K8S_38": "it publishes the node's ResourceSlice: the DRA driver's identity is this ServiceAccount",
}


class DraPluginObjects:
    """The node's plugin DaemonSet and its identity: a ServiceAccount, a ClusterRole and its binding."""

    def __init__(
        self,
        prefix: str,
        node_name: str | pulumi.Output[str],
        node: NodeConfig | pulumi.Output[NodeConfig],
        plugin: DevicePluginConfig,
        image: str,
        *,
        namespace: pulumi.Input[str],
        runtime_class: pulumi.Input[str],
        opts: pulumi.ResourceOptions,
    ) -> None:
        name = derive(node_name, dra_plugin_name)
        labels = derive(node_name, lambda n: plugin_labels(n, DRA_PLUGIN_NAME))
        self.service_account = k8s.core.v1.ServiceAccount(
            f"{prefix}-{DRA_PLUGIN_NAME}",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=namespace, labels=labels),
            opts=opts,
        )
        self.cluster_role = k8s.rbac.v1.ClusterRole(
            f"{prefix}-{DRA_PLUGIN_NAME}",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, labels=labels),
            rules=[
                k8s.rbac.v1.PolicyRuleArgs(api_groups=[group], resources=[resource], verbs=list(verbs))
                for group, resource, verbs in DRA_PLUGIN_RULES
            ],
            opts=opts,
        )
        self.binding = k8s.rbac.v1.ClusterRoleBinding(
            f"{prefix}-{DRA_PLUGIN_NAME}",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, labels=labels),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=self.cluster_role.metadata.name
            ),
            subjects=[
                k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=self.service_account.metadata.name,
                                        namespace=self.service_account.metadata.namespace)
            ],
            opts=opts,
        )  # fmt: skip
        self.daemon_set = k8s.apps.v1.DaemonSet(
            f"{prefix}-{DRA_PLUGIN_NAME}",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=name,
                namespace=namespace,
                labels=labels,
                annotations=scan_exceptions(SCAN_EXCEPTIONS, image, "dra.kubeletPluginImage"),
            ),
            spec=derive(node, lambda n: _spec(n, plugin, image, runtime_class)),
            # Its identity first: a pod without its binding would publish nothing and crash.
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[self.binding])),
        )


def _spec(
    node: NodeConfig, plugin: DevicePluginConfig, image: str, runtime_class: pulumi.Input[str]
) -> k8s.apps.v1.DaemonSetSpecArgs:
    labels = plugin_labels(node.name, DRA_PLUGIN_NAME)
    env = {
        # Also overrides the image's own `ENV NVIDIA_VISIBLE_DEVICES=all` (NVIDIA's chart sets `void` and privilege).
        VISIBLE_DEVICES_ENV: ",".join(node.exposed_gpus),
        "IMAGE_NAME": image,
        "CDI_ROOT": CDI_SPEC_DIR,
        "NVIDIA_DRIVER_ROOT": plugin.nvidia_driver_root,
        "DRIVER_ROOT_CTR_PATH": CONTAINER_DRIVER_ROOT,
        "KUBELET_REGISTRAR_DIRECTORY_PATH": KUBELET_PLUGINS_REGISTRY,
        "KUBELET_PLUGINS_DIRECTORY_PATH": KUBELET_PLUGINS,
        "HEALTHCHECK_PORT": str(DRA_HEALTH_PORT),
        "FEATURE_GATES": ",".join(f"{gate}=false" for gate in DRA_OFF_FEATURE_GATES),
    }
    probe = k8s.core.v1.GRPCActionArgs(port=DRA_HEALTH_PORT, service="liveness")
    host_dirs = {
        "plugins-registry": (KUBELET_PLUGINS_REGISTRY, KUBELET_PLUGINS_REGISTRY, "Directory"),
        "plugin-dir": (PLUGIN_DIR, PLUGIN_DIR, "DirectoryOrCreate"),
        "cdi-root": (CDI_SPEC_DIR, CDI_SPEC_DIR, "DirectoryOrCreate"),
        "driver-root": (plugin.nvidia_driver_root, CONTAINER_DRIVER_ROOT, "Directory"),
    }
    # Under a toolkit that ignores the variable for unprivileged pods (`volume-mounts`), asked for as mounts too.
    requests, request_mounts = device_requests(node, plugin)
    container = k8s.core.v1.ContainerArgs(
        name=DRA_PLUGIN_NAME,
        image=image,
        image_pull_policy="IfNotPresent",
        command=[DRA_PLUGIN_COMMAND],
        env=[k8s.core.v1.EnvVarArgs(name=k, value=v) for k, v in env.items()]
        + [downward("NODE_NAME", "spec.nodeName"), downward("NAMESPACE", "metadata.namespace")],
        security_context=unprivileged(),
        # As the chart's: a slow first NVML start is given ten minutes, then a probe every 30 s.
        startup_probe=k8s.core.v1.ProbeArgs(grpc=probe, failure_threshold=600, period_seconds=1),
        liveness_probe=k8s.core.v1.ProbeArgs(grpc=probe, failure_threshold=3, period_seconds=30, timeout_seconds=10),
        volume_mounts=[
            k8s.core.v1.VolumeMountArgs(name=n, mount_path=inside, read_only=True if n == "driver-root" else None)
            for n, (_, inside, _) in host_dirs.items()
        ]
        + request_mounts,
    )
    volumes = [
        k8s.core.v1.VolumeArgs(name=n, host_path=k8s.core.v1.HostPathVolumeSourceArgs(path=host, type=kind))
        for n, (host, _, kind) in host_dirs.items()
    ] + requests
    pod_spec = node_pod_spec(
        node.name, plugin, runtime_class, [container], volumes, service_account=dra_plugin_name(node.name)
    )
    return k8s.apps.v1.DaemonSetSpecArgs(
        selector=k8s.meta.v1.LabelSelectorArgs(match_labels=labels),
        template=k8s.core.v1.PodTemplateSpecArgs(metadata=k8s.meta.v1.ObjectMetaArgs(labels=labels), spec=pod_spec),
    )
