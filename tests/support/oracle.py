"""An independent model of "can this pod reach a device it did not request", written from the
upstream code rather than from the policy: the kubelet builds the environment (envFrom, then env
over it), the device plugin answers a positive request, containerd upper-cases capabilities, and
the NVIDIA toolkit picks devices from the final environment, mounts and privileges.

The model assumes the worst the cluster allows: every image carries `ENV NVIDIA_VISIBLE_DEVICES=all`
and `CUDA_VERSION` (CUDA base images), the toolkit accepts the env var from unprivileged containers
and device requests as mounts, and any hostPath could resolve to /dev/null or a device.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
REQUEST_ROOT = "/var/run/nvidia-container-devices"
NVIDIA_RESOURCE = re.compile(r"nvidia\.com/(gpu|gpu\..+|mig-.+)")
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")  # the kubelet skips envFrom keys that are not


@dataclass
class Cluster:
    """What the pod meets on the node: ConfigMaps and Secrets by name (decoded), the NVIDIA runtime
    classes, and the guard's allowances."""

    configmaps: dict[str, dict[str, str]] = field(default_factory=dict)
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    nvidia_classes: tuple[str, ...] = ("nvidia", "nvidia-cdi", "nvidia-legacy")
    our_class_prefix: str = "hidden-gpu-"
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
    upper = name.upper()
    return upper.removeprefix("CAP_")


def routes(pod: dict[str, Any], cluster: Cluster) -> list[str]:
    """Every way a container of this pod would reach a GPU or the host beyond what it requested."""
    spec = pod["spec"]
    found: list[str] = []
    runtime = spec.get("runtimeClassName") or ""
    under_nvidia = runtime.startswith(cluster.our_class_prefix) or runtime in cluster.nvidia_classes
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", []) or [] if "hostPath" in v}
    for path in host_paths.values():
        if path not in cluster.allowed_host_paths:
            found.append(f"hostPath {path}")
    annotations = pod["metadata"].get("annotations") or {}
    if any(key.startswith("cdi.k8s.io/") for key in annotations):
        found.append("CDI annotation")
    if spec.get("resourceClaims"):
        found.append("resource claim")
    every = [*(spec.get("initContainers") or []), *spec["containers"], *(spec.get("ephemeralContainers") or [])]
    for container in every:
        found += _container_routes(container, cluster, host_paths, under_nvidia)
    return found


def _container_routes(
    container: dict[str, Any], cluster: Cluster, host_paths: dict[str, str], under_nvidia: bool
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
        if mount["name"] in host_paths and destination.startswith(REQUEST_ROOT):
            found.append(f"{name}: device request mount {mount['mountPath']}")
        if mount["name"] in host_paths and not mount.get("readOnly"):
            found.append(f"{name}: writable hostPath")
    if under_nvidia:
        limits = (container.get("resources") or {}).get("limits") or {}
        requested = any(NVIDIA_RESOURCE.fullmatch(k) and quantity(v) > 0 for k, v in limits.items())
        own = final_env(container, cluster).get(VISIBLE, "unset")
        if own is None or (own != "unset" and not selects_no_gpu(own)):
            found.append(f"{name}: NVIDIA_VISIBLE_DEVICES={own} over any allocation")
        elif own == "unset" and not requested:
            found.append(f"{name}: the image's NVIDIA_VISIBLE_DEVICES=all, nothing requested")
    return found
