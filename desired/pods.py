"""What every pod hidden-gpu runs on one node shares (the pinned plugin, the pinned operands, the DRA plugin), as plain
Kubernetes objects: that node alone, by its name; no privilege; the plugin settings' tolerations, priority class and
pull secrets; the scan's deliberate exceptions written into the object.

Values a component knows only as Outputs (the namespace, the RuntimeClass's name) are placed as given: the objects
are plain mappings in the API's own field names, which the Kubernetes provider takes as they are."""

from __future__ import annotations

from typing import Any

from common.names import (
    DEV_NULL,
    DEVICE_REQUEST_DIR,
    FIELD_MANAGER,
    FIELD_MANAGER_ANNOTATION,
    NODE_LABEL,
    NVIDIA_RUNTIME_HANDLER,
    PART_OF,
    PART_OF_LABEL,
    PATCH_FORCE_ANNOTATION,
    PLUGIN_CONFIG_DIR,
    POOL_LABEL,
    SCAN_SKIP_ANNOTATION_PREFIX,
    SHARED_NODE_TAINT,
    SHARED_NODE_TAINT_EFFECT,
    DeviceListStrategy,
    plugin_config_name,
    plugin_labels,
    pool_class_name,
    runtime_class_name,
)
from stack_config.node_config import NodeConfig
from stack_config.plugin_config import DevicePluginConfig

Object = dict[str, Any]
# Objects `up` takes back whoever changed them meanwhile (retained ones, adopted ones, those stacks share): one
# well-known field manager, forcing over the others.
TAKEN_BACK = {FIELD_MANAGER_ANNOTATION: FIELD_MANAGER, PATCH_FORCE_ANNOTATION: "true"}


def fields(**values: Any) -> Object:
    """An object of the fields given a value: the API's defaults stand for the others, as a manifest leaves them out."""
    return {key: value for key, value in values.items() if value is not None}


def host_path(name: str, path: str, kind: str) -> Object:
    return {"name": name, "hostPath": {"path": path, "type": kind}}


def mount(name: str, path: str, *, read_only: bool | None = None) -> Object:
    return fields(name=name, mountPath=path, readOnly=read_only)


def env_vars(values: dict[str, str]) -> list[Object]:
    return [{"name": name, "value": value} for name, value in values.items()]


def on_node(node_name: str) -> Object:
    """Exactly this node, by its name: the DaemonSet controller itself schedules by metadata.name."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def shared_node_toleration() -> Object:
    """guard.scope sharedNodes' taint, tolerated by every pod hidden-gpu runs or lands whatever the scope."""
    return {"key": SHARED_NODE_TAINT, "operator": "Exists", "effect": SHARED_NODE_TAINT_EFFECT}


def runtime_scheduling(label: str, value: object) -> Object:
    """Where a pod of a hidden-gpu RuntimeClass lands: by our own node (or pool) label. It tolerates the shared-node
    taint always: such a pod is judged by the guard whatever its scope, and a change of guard.scope then changes no
    RuntimeClass (the RuntimeClass admission plugin adds the toleration to the pod)."""
    return {"nodeSelector": {label: value}, "tolerations": [shared_node_toleration()]}


def unprivileged(added: list[str] | None = None) -> Object:
    """Privileged would give the container every GPU of the host whatever NVIDIA_VISIBLE_DEVICES says."""
    return {"privileged": False, "allowPrivilegeEscalation": False, "capabilities": fields(drop=["ALL"], add=added)}


def node_pod_spec(
    node_name: str,
    plugin: DevicePluginConfig,
    runtime_class: object,
    containers: list[Object],
    volumes: list[Object],
    *,
    service_account: str | None = None,
    init_containers: list[Object] | None = None,
) -> Object:
    """A pod on this node alone, under its RuntimeClass (the toolkit's `nvidia` handler gives the containers the
    GPUs their NVIDIA_VISIBLE_DEVICES names), with an API token only where it has a `service_account` (the DRA
    plugin publishes its ResourceSlice; the device plugin and the operands talk to the kubelet alone)."""
    return fields(
        affinity=on_node(node_name),
        runtimeClassName=runtime_class,
        priorityClassName=plugin.priority_class_name,
        imagePullSecrets=[{"name": secret} for secret in plugin.image_pull_secrets] or None,
        serviceAccountName=service_account,
        automountServiceAccountToken=service_account is not None,
        securityContext={"seccompProfile": {"type": "RuntimeDefault"}},
        # And the shared-node taint, whatever guard.scope: a scope switched back to `cluster` before the nodes are
        # untainted must not leave a rolled plugin unschedulable on its own node.
        tolerations=[*(t.model_dump(exclude_none=True) for t in plugin.tolerations), shared_node_toleration()],
        initContainers=init_containers or None,
        containers=containers,
        volumes=volumes,
    )


def downward(name: str, field_path: str) -> Object:
    """A variable from the pod's own fields. apiVersion stated, not left to the API server's default: a fieldRef is
    applied whole (an atomic struct), so an `up` that creates the object again under another field manager (after an
    interrupted one) would conflict with the defaulted value (run: tests/real/test_interrupted_up.py)."""
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}


def device_requests(node: NodeConfig, plugin: DevicePluginConfig) -> tuple[list[Object], list[Object]]:
    """With `volume-mounts` the toolkit may ignore NVIDIA_VISIBLE_DEVICES for an unprivileged pod, so a pod of ours
    asks for its own GPUs the way the plugin answers allocations: /dev/null mounted per exposed UUID."""
    if plugin.device_list_strategy != DeviceListStrategy.VOLUME_MOUNTS:
        return [], []
    volumes = [host_path(uuid.lower(), DEV_NULL, "CharDevice") for uuid in node.exposed_gpus]
    mounts = [mount(uuid.lower(), f"{DEVICE_REQUEST_DIR}/{uuid}", read_only=True) for uuid in node.exposed_gpus]
    return volumes, mounts


def plugin_config_volume(node_name: str) -> tuple[Object, Object]:
    """The plugin's config file of a time-sliced node, read-only at PLUGIN_CONFIG_DIR: the plugin serves by it, GFD
    labels by it."""
    return (
        {"name": "plugin-config", "configMap": {"name": plugin_config_name(node_name)}},
        mount("plugin-config", PLUGIN_CONFIG_DIR, read_only=True),
    )


def scan_exceptions(exceptions: dict[str, str], image: str, image_key: str) -> dict[str, str]:
    """checkov's in-manifest skips (`checkov.io/skipN: CHECK=reason`), one per deliberate exception; an image pinned
    by tag alone is one, named by the setting (`image_key`) that would pin it by digest."""
    digest = ("CKV_K8S_43", f"pinned by tag as configured; give {image_key} a @sha256 digest to pin harder")
    listed = list(exceptions.items()) + ([] if "@sha256:" in image else [digest])
    return {
        f"{SCAN_SKIP_ANNOTATION_PREFIX}{n}": f"{check}={reason}" for n, (check, reason) in enumerate(listed, start=1)
    }


def daemon_set_spec(labels: dict[str, str], pod_spec: Object, *, annotations: dict[str, str] | None = None) -> Object:
    """One pod per matching node, selected by its own labels (an adopted plugin's selector is its own: the caller's)."""
    return {
        "selector": {"matchLabels": labels},
        "template": {"metadata": fields(labels=labels, annotations=annotations), "spec": pod_spec},
    }


def node_class_metadata(node_name: str) -> Object:
    """The node's own RuntimeClass: named after it, labelled as its plugin is."""
    return {"name": runtime_class_name(node_name), "labels": plugin_labels(node_name)}


def pool_class(pool: str) -> Object:
    """A pool's RuntimeClass: a pod naming it lands on any node of the pool (the scheduler picks one with a free
    exposed GPU)."""
    return {
        "metadata": {"name": pool_class_name(pool), "labels": {PART_OF_LABEL: PART_OF, POOL_LABEL: pool}},
        "handler": NVIDIA_RUNTIME_HANDLER,
        "scheduling": runtime_scheduling(POOL_LABEL, pool),
    }


def node_class_scheduling(node_name: str) -> Object:
    """Where the node's own RuntimeClass lands a pod: by our node label (kubernetes.io/hostname need not equal the
    node's name)."""
    return runtime_scheduling(NODE_LABEL, node_name)


def runtime_classes(nodes: list[NodeConfig]) -> list[Object]:
    """The RuntimeClasses of the nodes that expose GPUs, whole: each node's own, or its pool's once."""
    found: dict[str, Object] = {}
    for node in nodes:
        if not node.exposed_gpus:
            continue
        if node.pool:
            found.setdefault(f"pool {node.pool}", pool_class(node.pool))
        else:
            metadata, scheduling = node_class_metadata(node.name), node_class_scheduling(node.name)
            found[f"node {node.name}"] = {
                "metadata": metadata,
                "handler": NVIDIA_RUNTIME_HANDLER,
                "scheduling": scheduling,
            }
    return list(found.values())
