"""Names the program gives Kubernetes objects and labels, shared with the tools that look for them."""

from __future__ import annotations

# The GPU Operator deploys its device plugin on a node unless this label is `false`.
DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"
HOSTNAME_LABEL = "kubernetes.io/hostname"
PART_OF_LABEL = "app.kubernetes.io/part-of"
INSTANCE_LABEL = "app.kubernetes.io/instance"
PART_OF = "hidden-gpu"
PLUGIN_NAME_LABEL = "app.kubernetes.io/name"
PLUGIN_NAME = "nvidia-device-plugin"
# Capability names that grant SYS_ADMIN, which the NVIDIA toolkit treats as privileged.
SYS_ADMIN_CAPABILITIES = ("SYS_ADMIN", "CAP_SYS_ADMIN", "ALL")
# RuntimeClasses the GPU Operator creates and owns: never create or take over these.
OPERATOR_RUNTIME_CLASSES = ("nvidia", "nvidia-cdi", "nvidia-legacy")


def device_plugin_name(node_name: str) -> str:
    return f"{PLUGIN_NAME}-{node_name}"


# Every RuntimeClass this program creates starts so: it keeps clear of the operator's names, and
# lets the access guard recognise ours without listing every node.
RUNTIME_CLASS_PREFIX = "hidden-gpu-"


def plugin_config_name(node_name: str) -> str:
    return f"{device_plugin_name(node_name)}-config"


def runtime_class_name(node_name: str) -> str:
    return f"{RUNTIME_CLASS_PREFIX}{node_name}"


def plugin_labels(node_name: str) -> dict[str, str]:
    return {PLUGIN_NAME_LABEL: PLUGIN_NAME, INSTANCE_LABEL: node_name, PART_OF_LABEL: PART_OF}
