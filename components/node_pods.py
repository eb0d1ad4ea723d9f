"""What every DaemonSet hidden-gpu runs on one node shares (the pinned plugin and the pinned operands): that node
alone, by its name; no privilege; the plugin settings' tolerations, priority class and pull secrets; the scan's
deliberate exceptions written into the object."""

# No `from __future__ import annotations`: the components beside it are read by Pulumi's analyzer.
import pulumi
import pulumi_kubernetes as k8s

from common.names import (
    DEV_NULL,
    DEVICE_REQUEST_DIR,
    PLUGIN_CONFIG_DIR,
    SCAN_SKIP_ANNOTATION_PREFIX,
    SHARED_NODE_TAINT,
    SHARED_NODE_TAINT_EFFECT,
    DeviceListStrategy,
    plugin_config_name,
)
from stack_config.node_config import NodeConfig
from stack_config.plugin_config import DevicePluginConfig


def on_node(node_name: str) -> k8s.core.v1.AffinityArgs:
    """Exactly this node, by its name: the DaemonSet controller itself schedules by metadata.name."""
    return k8s.core.v1.AffinityArgs(
        node_affinity=k8s.core.v1.NodeAffinityArgs(
            required_during_scheduling_ignored_during_execution=k8s.core.v1.NodeSelectorArgs(
                node_selector_terms=[
                    k8s.core.v1.NodeSelectorTermArgs(
                        match_fields=[
                            k8s.core.v1.NodeSelectorRequirementArgs(
                                key="metadata.name", operator="In", values=[node_name]
                            )
                        ]
                    )
                ]
            )
        )
    )


def shared_node_toleration() -> k8s.core.v1.TolerationArgs:
    """guard.scope sharedNodes' taint, tolerated by every pod hidden-gpu runs or lands whatever the scope."""
    return k8s.core.v1.TolerationArgs(key=SHARED_NODE_TAINT, operator="Exists", effect=SHARED_NODE_TAINT_EFFECT)


def runtime_scheduling(label: str, value: pulumi.Input[str]) -> k8s.node.v1.SchedulingArgs:
    """Where a pod of a hidden-gpu RuntimeClass lands: by our own node (or pool) label. It tolerates the shared-node
    taint always: such a pod is judged by the guard whatever its scope, and a change of guard.scope then changes no
    RuntimeClass (the RuntimeClass admission plugin adds the toleration to the pod)."""
    return k8s.node.v1.SchedulingArgs(node_selector={label: value}, tolerations=[shared_node_toleration()])


def unprivileged(added: list[str] | None = None) -> k8s.core.v1.SecurityContextArgs:
    """Privileged would give the container every GPU of the host whatever NVIDIA_VISIBLE_DEVICES says."""
    return k8s.core.v1.SecurityContextArgs(
        privileged=False,
        allow_privilege_escalation=False,
        capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"], add=added),
    )


def node_pod_spec(
    node_name: str,
    plugin: DevicePluginConfig,
    runtime_class: pulumi.Input[str],
    containers: list[k8s.core.v1.ContainerArgs],
    volumes: list[k8s.core.v1.VolumeArgs],
    *,
    service_account: str | None = None,
    init_containers: list[k8s.core.v1.ContainerArgs] | None = None,
) -> k8s.core.v1.PodSpecArgs:
    """A pod on this node alone, under its RuntimeClass (the toolkit's `nvidia` handler gives the containers the
    GPUs their NVIDIA_VISIBLE_DEVICES names), with an API token only where it has a `service_account` (the DRA
    plugin publishes its ResourceSlice; the device plugin and the operands talk to the kubelet alone)."""
    return k8s.core.v1.PodSpecArgs(
        affinity=on_node(node_name),
        runtime_class_name=runtime_class,
        priority_class_name=plugin.priority_class_name,
        image_pull_secrets=[k8s.core.v1.LocalObjectReferenceArgs(name=s) for s in plugin.image_pull_secrets] or None,
        service_account_name=service_account,
        automount_service_account_token=service_account is not None,
        security_context=k8s.core.v1.PodSecurityContextArgs(
            seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault")
        ),
        # And the shared-node taint, whatever guard.scope: a scope switched back to `cluster` before the nodes are
        # untainted must not leave a rolled plugin unschedulable on its own node.
        tolerations=[
            *(k8s.core.v1.TolerationArgs(**t.model_dump(exclude_none=True)) for t in plugin.tolerations),
            shared_node_toleration(),
        ],
        init_containers=init_containers or None,
        containers=containers,
        volumes=volumes,
    )


def downward(name: str, field_path: str) -> k8s.core.v1.EnvVarArgs:
    """A variable from the pod's own fields. apiVersion stated, not left to the API server's default: a fieldRef is
    applied whole (an atomic struct), so an `up` that creates the object again under another field manager (after an
    interrupted one) would conflict with the defaulted value (run: tests/real/test_interrupted_up.py)."""
    source = k8s.core.v1.EnvVarSourceArgs(
        field_ref=k8s.core.v1.ObjectFieldSelectorArgs(api_version="v1", field_path=field_path)
    )
    return k8s.core.v1.EnvVarArgs(name=name, value_from=source)


def device_requests(
    node: NodeConfig, plugin: DevicePluginConfig
) -> tuple[list[k8s.core.v1.VolumeArgs], list[k8s.core.v1.VolumeMountArgs]]:
    """With `volume-mounts` the toolkit may ignore NVIDIA_VISIBLE_DEVICES for an unprivileged pod, so a pod of ours
    asks for its own GPUs the way the plugin answers allocations: /dev/null mounted per exposed UUID."""
    if plugin.device_list_strategy != DeviceListStrategy.VOLUME_MOUNTS:
        return [], []
    source = k8s.core.v1.HostPathVolumeSourceArgs(path=DEV_NULL, type="CharDevice")
    volumes = [k8s.core.v1.VolumeArgs(name=uuid.lower(), host_path=source) for uuid in node.exposed_gpus]
    mounts = [
        k8s.core.v1.VolumeMountArgs(name=uuid.lower(), mount_path=f"{DEVICE_REQUEST_DIR}/{uuid}", read_only=True)
        for uuid in node.exposed_gpus
    ]
    return volumes, mounts


def plugin_config_volume(node_name: str) -> tuple[k8s.core.v1.VolumeArgs, k8s.core.v1.VolumeMountArgs]:
    """The plugin's config file of a time-sliced node, read-only at PLUGIN_CONFIG_DIR: the plugin serves by it, GFD
    labels by it."""
    source = k8s.core.v1.ConfigMapVolumeSourceArgs(name=plugin_config_name(node_name))
    return (
        k8s.core.v1.VolumeArgs(name="plugin-config", config_map=source),
        k8s.core.v1.VolumeMountArgs(name="plugin-config", mount_path=PLUGIN_CONFIG_DIR, read_only=True),
    )


def scan_exceptions(exceptions: dict[str, str], image: str, image_key: str) -> dict[str, str]:
    """checkov's in-manifest skips (`checkov.io/skipN: CHECK=reason`), one per deliberate exception; an image pinned
    by tag alone is one, named by the setting (`image_key`) that would pin it by digest."""
    digest = ("CKV_K8S_43", f"pinned by tag as configured; give {image_key} a @sha256 digest to pin harder")
    listed = list(exceptions.items()) + ([] if "@sha256:" in image else [digest])
    return {
        f"{SCAN_SKIP_ANNOTATION_PREFIX}{n}": f"{check}={reason}" for n, (check, reason) in enumerate(listed, start=1)
    }
