"""An independent model of "can this pod reach a device the kubelet did not allocate to it", written
from what the scheduler, the kubelet, containerd and the NVIDIA toolkit do, never from the policy.

- Where the pod can run: a pod naming `spec.nodeName` skips the scheduler and meets only the kubelet,
  which drops requests for extended resources its node does not have
  (kubernetes `pkg/kubelet/lifecycle/predicate.go`, `removeMissingExtendedResources`) and still checks
  the node selector the RuntimeClass merged in; any other pod lands only where the scheduler finds every
  resource it requests (`noderesources.Fits`) and its node selector matches.
- What the node does: the device manager calls `Allocate` only for a positive request of a resource a
  plugin serves on that node (`cm/devicemanager/manager.go`, `allocateContainerResources`); the plugin's
  answer sets NVIDIA_VISIBLE_DEVICES, the pod's own env (envFrom, then env) overrides it, and the image's
  `ENV NVIDIA_VISIBLE_DEVICES=all` (every CUDA image) stands where neither does.
- Which runtime runs it: the RuntimeClass's handler, if the node has it; the node's default otherwise.
- The toolkit (only under an NVIDIA handler) picks devices from the final environment, device-request
  mounts, privileges, and the CDI annotations containerd and its NRI plugin read; with any device visible
  it adds node-wide ones for its feature variables.

The model assumes the worst the cluster allows: the toolkit accepts the env var from unprivileged
containers and device requests as mounts, any hostPath could resolve to /dev/null or a device, and a node
whose GPUs are all hidden still has the nvidia handler.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
FEATURES = ("NVIDIA_GDS", "NVIDIA_GDRCOPY", "NVIDIA_IMEX_CHANNELS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH")
REQUEST_ROOTS = ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")
CDI_DOMAIN = "cdi.k8s.io"
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")  # the kubelet skips envFrom keys that are not
EXTENDED = re.compile(r"[^/]+\.[^/]+/.+")  # a domain-qualified name: not cpu, memory, ephemeral-storage
NVIDIA_RESOURCE = re.compile(r"nvidia\.com/(gpu|gpu\..+|mig-.+)")
NVIDIA = "nvidia"


@dataclass(frozen=True)
class Node:
    """A node as the kubelet sees it: labels, what its device plugins serve (name -> allocatable), the
    runtime handlers containerd has, and the one it uses for pods without a RuntimeClass."""

    name: str
    labels: dict[str, str]
    serves: dict[str, int]
    handlers: frozenset[str] = frozenset({"runc", NVIDIA})
    default_handler: str = "runc"


@dataclass(frozen=True)
class RuntimeClass:
    handler: str
    node_selector: dict[str, str] = field(default_factory=dict)


@dataclass
class Cluster:
    """What the pod meets: nodes, RuntimeClasses, ConfigMaps and Secrets by name (decoded), allowed host paths."""

    nodes: list[Node]
    runtime_classes: dict[str, RuntimeClass]
    configmaps: dict[str, dict[str, str]] = field(default_factory=dict)
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    allowed_host_paths: tuple[str, ...] = ()


def quantity(text: str) -> float:
    """A Kubernetes quantity's value, for the plain forms the generator writes."""
    number = re.fullmatch(r"([+-]?[0-9.]+)(?:[eE]([+-]?[0-9]+))?", text)
    if number is None:
        raise ValueError(text)
    return float(number.group(1)) * 10.0 ** int(number.group(2) or 0)


def selects_no_gpu(value: str) -> bool:
    """The toolkit's reading of NVIDIA_VISIBLE_DEVICES (devicesFromEnvvars, NewVisibleDevices)."""
    devices = [d.strip() for d in value.split(",") if d.strip()]
    if not devices or "void" in devices:
        return True
    for device in devices:  # the first of all / none decides
        if device in ("all", "none"):
            return device == "none"
    return False


def final_env(container: dict[str, Any], cluster: Cluster) -> dict[str, str | None]:
    """The kubelet's makeEnvironmentVariables: envFrom first, then env over it. None: a value the
    pod's author controls through a reference (valueFrom)."""
    result: dict[str, str | None] = {}
    for source in container.get("envFrom", []) or []:
        data = (
            cluster.configmaps.get(source["configMapRef"]["name"], {})
            if "configMapRef" in source
            else cluster.secrets.get(source.get("secretRef", {}).get("name", ""), {})
        )
        for key, value in data.items():
            name = (source.get("prefix") or "") + key
            if ENV_NAME.fullmatch(name):
                result[name] = value
    for item in container.get("env", []) or []:
        result[item["name"]] = item.get("value", "") if "valueFrom" not in item else None
    return result


def _capability(name: str) -> str:
    return name.upper().removeprefix("CAP_")


def _requests(container: dict[str, Any]) -> dict[str, float]:
    """Positive extended-resource requests (the API server requires limits == requests for them)."""
    limits = (container.get("resources") or {}).get("limits") or {}
    return {k: quantity(v) for k, v in limits.items() if EXTENDED.fullmatch(k) and quantity(v) > 0}


def _pod_request(spec: dict[str, Any]) -> dict[str, float]:
    """The scheduler's effective request: the larger of the init containers' largest and the containers' sum."""
    total: dict[str, float] = {}
    for container in spec["containers"]:
        for name, amount in _requests(container).items():
            total[name] = total.get(name, 0) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in _requests(container).items():
            total[name] = max(total.get(name, 0), amount)
    return total


def _selected(node: Node, selector: dict[str, str]) -> bool:
    return all(node.labels.get(k) == v for k, v in selector.items())


def landing_nodes(pod: dict[str, Any], cluster: Cluster) -> list[Node]:
    """Where the pod can run, and so meet a kubelet."""
    spec = pod["spec"]
    if (spec.get("os") or {}).get("name", "linux") != "linux":
        return []  # the kubelet refuses a pod for another OS (predicate.go, rejectPodAdmissionBasedOnOSField)
    selector = dict(spec.get("nodeSelector") or {})
    name = spec.get("runtimeClassName")
    if name:
        if name not in cluster.runtime_classes:
            return []  # RuntimeClass admission refuses a pod naming a class that does not exist
        selector |= cluster.runtime_classes[name].node_selector
    candidates = [n for n in cluster.nodes if _selected(n, selector)]
    if spec.get("nodeName"):
        return [n for n in candidates if n.name == spec["nodeName"]]
    wanted = _pod_request(spec)
    return [n for n in candidates if all(n.serves.get(k, 0) >= amount for k, amount in wanted.items())]


def routes(pod: dict[str, Any], cluster: Cluster) -> list[str]:
    """Every way a container of this pod would reach a device (or the host) the kubelet did not allocate to it."""
    spec = pod["spec"]
    found: list[str] = []
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", []) or [] if "hostPath" in v}
    for path in host_paths.values():
        if path not in cluster.allowed_host_paths:
            found.append(f"hostPath {path}")
    for flag in ("hostPID", "hostIPC", "hostNetwork"):
        if spec.get(flag):
            found.append(flag)
    # A pod's resourceClaims are no route of their own: each claim was judged when it was created, by the class it
    # names (tests/test_access_guard_claims.py).
    every = [*(spec.get("initContainers") or []), *spec["containers"], *(spec.get("ephemeralContainers") or [])]
    for node in landing_nodes(pod, cluster):
        name = spec.get("runtimeClassName")
        handler = cluster.runtime_classes[name].handler if name else node.default_handler
        if handler not in node.handlers:
            continue  # the sandbox cannot start on this node
        annotations = pod["metadata"].get("annotations") or {}
        for key in annotations:  # containerd (cdi.k8s.io/) and the toolkit's NRI plugin (nvidia.cdi.k8s.io/)
            if key.split("/", 1)[0] == CDI_DOMAIN or key.split("/", 1)[0].endswith("." + CDI_DOMAIN):
                found.append(f"{node.name}: CDI annotation {key}")
        for container in every:
            found += [f"{node.name}: {r}" for r in _container_routes(container, cluster, host_paths, node, handler)]
    return sorted(set(found))


def _container_routes(
    container: dict[str, Any], cluster: Cluster, host_paths: dict[str, str], node: Node, handler: str
) -> list[str]:
    name, found = container["name"], []
    security = container.get("securityContext") or {}
    added = (security.get("capabilities") or {}).get("add") or []
    if security.get("privileged"):
        found.append(f"{name}: privileged")
    if "ALL" in added or any(_capability(c) == "SYS_ADMIN" for c in added):
        found.append(f"{name}: SYS_ADMIN")
    for mount in container.get("volumeMounts", []) or []:
        destination = posixpath.normpath(mount["mountPath"])
        if mount["name"] in host_paths and destination.startswith(REQUEST_ROOTS):
            found.append(f"{name}: device request mount {mount['mountPath']}")
        if mount["name"] in host_paths and not mount.get("readOnly"):
            found.append(f"{name}: writable hostPath")
    if handler != NVIDIA:
        return found
    allocated = any(resource in node.serves for resource in _requests(container))
    env = final_env(container, cluster)
    own = env.get(VISIBLE, "unset")
    if own is None or (own != "unset" and not selects_no_gpu(own)):
        found.append(f"{name}: NVIDIA_VISIBLE_DEVICES={own} over any allocation")
    elif own == "unset" and not allocated:
        found.append(f"{name}: the image's NVIDIA_VISIBLE_DEVICES=all, nothing allocated")
    sees_a_device = own is None or (own == "unset") or not selects_no_gpu(own)
    for feature in FEATURES:
        if feature in env and sees_a_device:
            found.append(f"{name}: {feature} adds node-wide devices")
    return found


def example_cluster(allowed_host_paths: tuple[str, ...] = ()) -> Cluster:
    """The world of tests/support/stacks.valid_config, as the nodes would really be: gpu-node-01 serves its
    one exposed GPU as nvidia.com/gpu only; gpu-node-02 (every GPU hidden) serves nothing but keeps the
    nvidia handler; beside them an operator-run node whose every GPU is ours, and a CPU node. The
    RuntimeClasses are the stack's, the GPU Operator's, a distribution's and two sandboxes' (the guard's
    test config lists runc and gvisor as plain; kata has no handler on these nodes)."""
    nodes = [
        Node("gpu-node-01", {"hidden-gpu.io/node": "gpu-node-01"}, {"nvidia.com/gpu": 1}),
        Node("gpu-node-02", {"hidden-gpu.io/node": "gpu-node-02"}, {}),
        Node("gpu-node-03", {}, {"nvidia.com/gpu": 7, "nvidia.com/mig-1g.18gb": 7}),
        Node("cpu-node", {}, {}, handlers=frozenset({"runc", "runsc"})),
    ]
    classes = {
        "hidden-gpu-gpu-node-01": RuntimeClass(NVIDIA, {"hidden-gpu.io/node": "gpu-node-01"}),
        **{name: RuntimeClass(NVIDIA) for name in ("nvidia", "nvidia-cdi", "nvidia-legacy", "nvidia-experimental")},
        "runc": RuntimeClass("runc"),
        "gvisor": RuntimeClass("runsc"),
        "kata": RuntimeClass("kata-qemu"),
    }
    return Cluster(nodes, classes, allowed_host_paths=allowed_host_paths)
