"""The plugin namespace and the network its pods do not need, as plain Kubernetes objects (PluginNamespace declares
them; cluster.verify compares the live policies with them)."""

from __future__ import annotations

from common.names import (
    DCGM_EXPORTER_PORT,
    OPERANDS_NETWORK_POLICY,
    PART_OF,
    PART_OF_LABEL,
    PINNED_OPERANDS,
    PLUGIN_NAME,
    PLUGIN_NAME_LABEL,
    PLUGIN_NETWORK_POLICY,
    POD_SECURITY_ENFORCE_LABEL,
)
from desired.pods import TAKEN_BACK, Object

LABELS = {PART_OF_LABEL: PART_OF}


def namespace_metadata(name: str) -> Object:
    """The plugin pods mount the kubelet's device-plugin directory from the host, which Pod Security `baseline`
    forbids."""
    return {"name": name, "labels": {**LABELS, POD_SECURITY_ENFORCE_LABEL: "privileged"}}


def network_policies(namespace: object) -> dict[str, Object]:
    """By the suffix their resources are named with: no network for the plugin pods (a device plugin talks to the
    kubelet over a unix socket only); for the pinned GFD and dcgm-exporter no egress and ingress only to the
    exporter's metrics port (they read GPUs and the kubelet's PodResources over local files and a unix socket).
    `namespace` placed as given. Taken back by another `up` of any stack without a conflict: stacks that share a
    cluster share the plugin namespace (offline.fleet) and so these policies."""

    def metadata(name: str) -> Object:
        return {"name": name, "namespace": namespace, "labels": LABELS, "annotations": TAKEN_BACK}

    operands = {"key": PLUGIN_NAME_LABEL, "operator": "In", "values": sorted(PINNED_OPERANDS.values())}
    both = ["Ingress", "Egress"]
    metrics = [{"ports": [{"port": DCGM_EXPORTER_PORT, "protocol": "TCP"}]}]
    return {
        "no-network": {
            "metadata": metadata(PLUGIN_NETWORK_POLICY),
            "spec": {"podSelector": {"matchLabels": {PLUGIN_NAME_LABEL: PLUGIN_NAME}}, "policyTypes": both},
        },
        "operands-metrics-only": {
            "metadata": metadata(OPERANDS_NETWORK_POLICY),
            "spec": {"podSelector": {"matchExpressions": [operands]}, "policyTypes": both, "ingress": metrics},
        },
    }
