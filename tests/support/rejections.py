"""Configs every reader must refuse, each with the key, value and reason its one-line message must name: the
same cases for parse_project_config, render and the program (tests/test_config.py, tests/test_render.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.support.stacks import EXPOSED, HIDDEN, changed, node, volume_mounts


@dataclass(frozen=True)
class Rejection:
    """A config that must be refused, and what the one-line message must name."""

    id: str
    config: dict[str, Any]
    key: str
    value: str | None
    reason: str


def _set_allowed_host_path(path: str) -> Callable[[dict[str, Any]], None]:
    return lambda c: c.__setitem__("hidden-gpu:guard", {"allowedHostPaths": [path]})


REJECTIONS = [
    Rejection(
        "gpu-index-number",
        changed(lambda c: node(c).__setitem__("exposedGpus", [0])),
        "hidden-gpu:nodes[0].exposedGpus[0]",
        "0",
        "indices can change across reboots",
    ),
    Rejection(
        "gpu-index-string",
        changed(lambda c: node(c).__setitem__("hiddenGpus", ["3"])),
        "hidden-gpu:nodes[0].hiddenGpus[0]",
        '"3"',
        "GPU index, not a UUID",
    ),
    Rejection(
        "malformed-uuid",
        changed(lambda c: node(c).__setitem__("exposedGpus", ["GPU-5f3c1a2b"])),
        "hidden-gpu:nodes[0].exposedGpus[0]",
        '"GPU-5f3c1a2b"',
        "not a GPU UUID",
    ),
    Rejection(
        "uppercase-uuid",
        changed(lambda c: node(c).__setitem__("exposedGpus", [EXPOSED.upper()])),
        "hidden-gpu:nodes[0].exposedGpus[0]",
        EXPOSED.upper(),
        "lowercase hex",
    ),
    Rejection(
        "all-instead-of-uuids",
        changed(lambda c: node(c).__setitem__("exposedGpus", ["all"])),
        "hidden-gpu:nodes[0].exposedGpus[0]",
        '"all"',
        "not a GPU",
    ),
    Rejection(
        "uuid-twice-on-one-node",
        changed(lambda c: node(c).__setitem__("exposedGpus", [EXPOSED, EXPOSED])),
        "hidden-gpu:nodes[0].exposedGpus[1]",
        EXPOSED,
        "listed twice on this node",
    ),
    Rejection(
        "uuid-on-two-nodes",
        changed(lambda c: node(c, 1).__setitem__("hiddenGpus", [EXPOSED])),
        "hidden-gpu:nodes[1].hiddenGpus[0]",
        EXPOSED,
        "also listed on another node (nodes[0].exposedGpus[0])",
    ),
    Rejection(
        "uuid-exposed-and-hidden",
        changed(lambda c: node(c).__setitem__("hiddenGpus", [EXPOSED])),
        "hidden-gpu:nodes[0].hiddenGpus[0]",
        EXPOSED,
        "both exposed and hidden",
    ),
    Rejection(
        "unknown-top-level-key",
        changed(lambda c: c.__setitem__("hidden-gpu:quota", {"ml-team": 1})),
        "hidden-gpu:quota",
        None,
        "unknown key; did you mean 'quotas'?",
    ),
    Rejection(
        "misspelt-node-key",
        changed(lambda c: node(c).__setitem__("hidenGpus", list(HIDDEN))),
        "hidden-gpu:nodes[0].hidenGpus",
        None,
        "unknown key; did you mean 'hiddenGpus'?",
    ),
    Rejection(
        "misspelt-plugin-key",
        changed(lambda c: c["hidden-gpu:devicePlugin"].__setitem__("namespce", "gpu")),
        "hidden-gpu:devicePlugin.namespce",
        '"gpu"',
        "unknown key; did you mean 'namespace'?",
    ),
    Rejection(
        "no-nodes",
        changed(lambda c: c.pop("hidden-gpu:nodes")),
        "hidden-gpu:nodes",
        None,
        "required key is missing",
    ),
    Rejection(
        "nodes-not-a-list",
        changed(lambda c: c.__setitem__("hidden-gpu:nodes", {"name": "gpu-node-01"})),
        "hidden-gpu:nodes",
        None,
        "must be a list",
    ),
    Rejection(
        "nodes-empty",
        changed(lambda c: c.__setitem__("hidden-gpu:nodes", [])),
        "hidden-gpu:nodes",
        "[]",
        "must not be empty",
    ),
    Rejection(
        "node-without-name",
        changed(lambda c: node(c).pop("name")),
        "hidden-gpu:nodes[0].name",
        None,
        "required key is missing",
    ),
    Rejection(
        "node-without-exposed-gpus",
        changed(lambda c: node(c).pop("exposedGpus")),
        "hidden-gpu:nodes[0].exposedGpus",
        None,
        "required key is missing",
    ),
    Rejection(
        "node-name-not-dns1123",
        changed(lambda c: node(c).__setitem__("name", "GPU_Node_01")),
        "hidden-gpu:nodes[0].name",
        '"GPU_Node_01"',
        "not a valid node name",
    ),
    Rejection(
        "node-listed-twice",
        changed(lambda c: node(c, 1).__setitem__("name", "gpu-node-01")),
        "hidden-gpu:nodes[1].name",
        '"gpu-node-01"',
        "node listed twice",
    ),
    Rejection(
        "negative-quota",
        changed(lambda c: c.__setitem__("hidden-gpu:quotas", {"ml-team": -1})),
        "hidden-gpu:quotas.ml-team",
        "-1",
        "must be at least 0",
    ),
    Rejection(
        "fractional-quota",
        changed(lambda c: c.__setitem__("hidden-gpu:quotas", {"ml-team": 1.5})),
        "hidden-gpu:quotas.ml-team",
        "1.5",
        "must be a whole number",
    ),
    Rejection(
        "quota-as-text",
        changed(lambda c: c.__setitem__("hidden-gpu:quotas", {"ml-team": "two"})),
        "hidden-gpu:quotas.ml-team",
        '"two"',
        "must be a whole number",
    ),
    Rejection(
        "quota-namespace-invalid",
        changed(lambda c: c.__setitem__("hidden-gpu:quotas", {"ML_Team": 1})),
        "hidden-gpu:quotas.ML_Team (the key)",
        '"ML_Team"',
        "not a valid namespace name",
    ),
    Rejection(
        "plugin-namespace-invalid",
        changed(lambda c: c["hidden-gpu:devicePlugin"].__setitem__("namespace", "-gpu")),
        "hidden-gpu:devicePlugin.namespace",
        '"-gpu"',
        "not a valid namespace name",
    ),
    Rejection(
        "image-without-tag",
        changed(lambda c: c["hidden-gpu:devicePlugin"].__setitem__("image", "nvcr.io/nvidia/k8s-device-plugin")),
        "hidden-gpu:devicePlugin.image",
        '"nvcr.io/nvidia/k8s-device-plugin"',
        "no tag or digest",
    ),
    Rejection(
        "image-latest",
        changed(lambda c: c["hidden-gpu:devicePlugin"].__setitem__("image", "nvcr.io/nvidia/k8s-device-plugin:latest")),
        "hidden-gpu:devicePlugin.image",
        '"nvcr.io/nvidia/k8s-device-plugin:latest"',
        "':latest' is not a pinned version",
    ),
    Rejection(
        "guard-mode-unknown",
        changed(lambda c: c.__setitem__("hidden-gpu:guard", {"mode": "block"})),
        "hidden-gpu:guard.mode",
        '"block"',
        "must be one of 'enforce', 'warn' or 'audit'",
    ),
    Rejection(
        "guard-exempt-namespace-invalid",
        changed(lambda c: c.__setitem__("hidden-gpu:guard", {"exemptNamespaces": ["Kube_System"]})),
        "hidden-gpu:guard.exemptNamespaces[0]",
        '"Kube_System"',
        "not a valid namespace name",
    ),
    Rejection(
        "device-list-strategy-unknown",
        changed(lambda c: c["hidden-gpu:devicePlugin"].__setitem__("deviceListStrategy", "cdi-annotations")),
        "hidden-gpu:devicePlugin.deviceListStrategy",
        '"cdi-annotations"',
        "must be one of 'envvar', 'volume-mounts' or 'cdi-cri'",
    ),
    Rejection(
        "volume-mounts-without-the-toolkit-setting",
        changed(lambda c: c["hidden-gpu:devicePlugin"].__setitem__("deviceListStrategy", "volume-mounts")),
        "hidden-gpu:devicePlugin.volumeMountsAcceptedBy",
        None,
        "required with deviceListStrategy volume-mounts",
    ),
    Rejection(
        "volume-mounts-said-to-come-from-an-absent-patch",
        changed(lambda c: volume_mounts(c, "clusterPolicy")),
        "hidden-gpu:devicePlugin.volumeMountsAcceptedBy",
        '"clusterPolicy"',
        "clusterPolicy.patch is false",
    ),
    Rejection(
        "sys-admin-cannot-be-allowed",
        changed(lambda c: c.__setitem__("hidden-gpu:guard", {"allowedCapabilities": ["SYS_ADMIN"]})),
        "hidden-gpu:guard.allowedCapabilities[0]",
        '"SYS_ADMIN"',
        "never allowed",
    ),
    Rejection(
        "allowed-host-path-not-normal",
        changed(lambda c: c.__setitem__("hidden-gpu:guard", {"allowedHostPaths": ["/var//log"]})),
        "hidden-gpu:guard.allowedHostPaths[0]",
        '"/var//log"',
        "normal form",
    ),
    *(
        Rejection(
            f"allowed-host-path-{case}",
            changed(_set_allowed_host_path(path)),
            "hidden-gpu:guard.allowedHostPaths[0]",
            f'"{path}"',
            f"never allowed to tenants: it is, holds or lies inside {protected}",
        )
        for case, path, protected in (
            ("root", "/", "/dev"),
            ("var-run", "/var/run", "/var/run"),
            ("holds-runtime-state", "/var/lib", "/var/lib/containerd"),
            ("socket-under-run", "/run/containerd/containerd.sock", "/run"),
            ("kubelet-socket", "/var/lib/kubelet/pod-resources", "/var/lib/kubelet"),
        )
    ),
    Rejection(
        "retired-nvidia-runtime-classes",
        changed(lambda c: c.__setitem__("hidden-gpu:guard", {"nvidiaRuntimeClasses": ["nvidia"]})),
        "hidden-gpu:guard.nvidiaRuntimeClasses",
        '["nvidia"]',
        "every RuntimeClass is now judged as NVIDIA's unless listed in guard.plainRuntimeClasses",
    ),
    Rejection(
        "operator-class-declared-plain",
        changed(lambda c: c.__setitem__("hidden-gpu:guard", {"plainRuntimeClasses": ["gvisor", "nvidia"]})),
        "hidden-gpu:guard.plainRuntimeClasses[1]",
        '"nvidia"',
        "an NVIDIA RuntimeClass",
    ),
    Rejection(
        "toolkit-off-where-gpus-are-exposed",
        changed(lambda c: node(c).__setitem__("operands", {"containerToolkit": False})),
        "hidden-gpu:nodes[0].operands.containerToolkit",
        "false",
        "its pinned plugin and GPU pods run under the toolkit's nvidia runtime",
    ),
    Rejection(
        "cluster-policy-patch-with-envvar-plugins",
        changed(lambda c: c.__setitem__("hidden-gpu:clusterPolicy", {"patch": True})),
        "hidden-gpu:clusterPolicy.patch",
        "true",
        "needs devicePlugin.deviceListStrategy: volume-mounts",
    ),
    Rejection(
        "operand-misspelt",
        changed(lambda c: node(c).__setitem__("operands", {"gpuFeatureDiscovry": True})),
        "hidden-gpu:nodes[0].operands.gpuFeatureDiscovry",
        None,
        "did you mean 'gpuFeatureDiscovery'?",
    ),
    Rejection(
        "image-bad-digest",
        changed(
            lambda c: c["hidden-gpu:devicePlugin"].__setitem__("image", "nvcr.io/nvidia/k8s-device-plugin@sha256:1")
        ),
        "hidden-gpu:devicePlugin.image",
        None,
        "malformed digest",
    ),
    # One allocator per exposed GPU (issue 40, 2): the old meaning of hidden-gpu:dra made a DeviceClass of the GPUs
    # the plugin advertises.
    Rejection(
        "dra-classes-of-plugin-gpus",
        changed(lambda c: c.__setitem__("hidden-gpu:dra", {})),
        "hidden-gpu:dra",
        "{}",
        "no node has allocator: dra, so every exposed GPU is the device plugin's",
    ),
    Rejection(
        "allocator-unknown",
        changed(lambda c: node(c).__setitem__("allocator", "both")),
        "hidden-gpu:nodes[0].allocator",
        '"both"',
        "must be one of 'devicePlugin' or 'dra'",
    ),
    Rejection(
        "pool-of-two-allocators",
        changed(
            lambda c: c["hidden-gpu:nodes"].__setitem__(
                slice(None),
                [
                    {"name": "gpu-node-01", "pool": "p", "exposedGpus": [EXPOSED]},
                    {"name": "gpu-node-02", "pool": "p", "exposedGpus": [], "allocator": "dra"},
                ],
            )
        ),
        "hidden-gpu:nodes[1].allocator",
        '"dra"',
        "pool p is allocated by devicePlugin (nodes[0]): a pool's nodes share one allocator",
    ),
    Rejection(
        "dra-node-time-sliced",
        changed(lambda c: node(c).update({"allocator": "dra", "timeSlicing": {"replicas": 2}})),
        "hidden-gpu:nodes[0].timeSlicing",
        '{"replicas": 2',
        "not with allocator: dra: time-slicing is the device plugin's",
    ),
    Rejection(
        "dra-node-adopts-a-plugin",
        changed(
            lambda c: node(c).update(
                {
                    "allocator": "dra",
                    "adoptDevicePlugin": {
                        "namespace": "kube-system",
                        "name": "hand-made",
                        "matchLabels": {"a": "b"},
                        "container": "plugin",
                    },
                }
            )
        ),
        "hidden-gpu:nodes[0].adoptDevicePlugin",
        None,
        "not with allocator: dra: a hand-made plugin would hand the GPUs out beside DRA",
    ),
    # Each name says what it is: a pool or a container named wrong was refused as "not a valid namespace name".
    Rejection(
        "pool-name-invalid",
        changed(lambda c: node(c).__setitem__("pool", "Shared_Pool")),
        "hidden-gpu:nodes[0].pool",
        '"Shared_Pool"',
        "not a valid pool name",
    ),
    Rejection(
        "adopted-container-name-invalid",
        changed(
            lambda c: node(c).__setitem__(
                "adoptDevicePlugin",
                {"namespace": "kube-system", "name": "hand-made", "matchLabels": {"a": "b"}, "container": "Plugin_1"},
            )
        ),
        "hidden-gpu:nodes[0].adoptDevicePlugin.container",
        '"Plugin_1"',
        "not a valid container name",
    ),
]
