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

from __future__ import annotations

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
from desired.pods import (
    Object,
    daemon_set_spec,
    device_requests,
    downward,
    env_vars,
    host_path,
    mount,
    node_pod_spec,
    scan_exceptions,
    unprivileged,
)
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


RBAC_GROUP = "rbac.authorization.k8s.io"


def identity_metadata(node_name: str, namespace: object = None) -> Object:
    """The name and labels of the plugin's ServiceAccount (in `namespace`, placed as given), ClusterRole and binding."""
    metadata = {"name": dra_plugin_name(node_name), "labels": plugin_labels(node_name, DRA_PLUGIN_NAME)}
    return metadata if namespace is None else {**metadata, "namespace": namespace}


def cluster_role_rules() -> list[Object]:
    """What the plugin may do with the API: publish its ResourceSlices, read the claims it prepares."""
    return [
        {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}
        for group, resource, verbs in DRA_PLUGIN_RULES
    ]


def role_ref(role: object) -> Object:
    return {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role}


def subject(account: object, namespace: object) -> Object:
    return {"kind": "ServiceAccount", "name": account, "namespace": namespace}


def daemon_set_metadata(node_name: str, image: str, namespace: object) -> Object:
    annotations = scan_exceptions(SCAN_EXCEPTIONS, image, "dra.kubeletPluginImage")
    return {**identity_metadata(node_name, namespace), "annotations": annotations}


def dra_plugin_spec(node: NodeConfig, plugin: DevicePluginConfig, image: str, runtime_class: object) -> Object:
    """The DaemonSet's spec; `runtime_class` placed as given (a component's Output, or the name)."""
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
    probe = {"port": DRA_HEALTH_PORT, "service": "liveness"}
    host_dirs = {
        "plugins-registry": (KUBELET_PLUGINS_REGISTRY, KUBELET_PLUGINS_REGISTRY, "Directory"),
        "plugin-dir": (PLUGIN_DIR, PLUGIN_DIR, "DirectoryOrCreate"),
        "cdi-root": (CDI_SPEC_DIR, CDI_SPEC_DIR, "DirectoryOrCreate"),
        "driver-root": (plugin.nvidia_driver_root, CONTAINER_DRIVER_ROOT, "Directory"),
    }
    # Under a toolkit that ignores the variable for unprivileged pods (`volume-mounts`), asked for as mounts too.
    requests, request_mounts = device_requests(node, plugin)
    container = {
        "name": DRA_PLUGIN_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": [DRA_PLUGIN_COMMAND],
        "env": [*env_vars(env), downward("NODE_NAME", "spec.nodeName"), downward("NAMESPACE", "metadata.namespace")],
        "securityContext": unprivileged(),
        # As the chart's: a slow first NVML start is given ten minutes, then a probe every 30 s.
        "startupProbe": {"grpc": probe, "failureThreshold": 600, "periodSeconds": 1},
        "livenessProbe": {"grpc": probe, "failureThreshold": 3, "periodSeconds": 30, "timeoutSeconds": 10},
        "volumeMounts": [
            mount(n, inside, read_only=True if n == "driver-root" else None) for n, (_, inside, _) in host_dirs.items()
        ]
        + request_mounts,
    }
    volumes = [host_path(n, host, kind) for n, (host, _, kind) in host_dirs.items()] + requests
    account = dra_plugin_name(node.name)
    pod_spec = node_pod_spec(node.name, plugin, runtime_class, [container], volumes, service_account=account)
    return daemon_set_spec(labels, pod_spec)


def dra_plugin_objects(node: NodeConfig, plugin: DevicePluginConfig, image: str) -> list[Object]:
    """What the stack declares for a DRA node's plugin, whole, in the stack's own namespace and RuntimeClass: what
    cluster.verify compares the live objects with."""
    namespace = plugin.namespace
    account = identity_metadata(node.name, namespace)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": account},
        {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRole", "metadata": identity_metadata(node.name),
         "rules": cluster_role_rules()},
        {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRoleBinding", "metadata": identity_metadata(node.name),
         "roleRef": role_ref(account["name"]), "subjects": [subject(account["name"], namespace)]},
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": daemon_set_metadata(node.name, image, namespace),
         "spec": dra_plugin_spec(node, plugin, image, node.class_name)},
    ]  # fmt: skip
