"""NVIDIA's GPU Operator as a component of the real tier: installed as its Helm chart installs it, run as a process.

What is real: the controller (`cmd/gpu-operator`, built by e2e.build's `gpuoperator` group from the one version the
module proxy serves, e2e/go/gpuoperator/go.mod), its CRDs, its state assets, and the chart's ServiceAccount,
ClusterRole and Role, all read from that module's own files in Go's module cache at run time (nothing of it is
committed). It runs under the chart's service account with a TokenRequest token, never as an administrator.

Where it differs from the chart's install, and why:
- The ClusterPolicy is the chart's values.yaml cut to the CRD's schema (`cluster_policy`), not `helm template`:
  the chart's template maps each values section onto the spec field of the same name; building Helm for it would
  add about 9 minutes to a cold CI run.
- The chart's RBAC templates are read with their three template constructs resolved (`_resolved`).
- The assets are bind-mounted at the hard-coded /opt/gpu-operator (controllers/state_manager.go:791-809,
  internal/state/manager.go:122) in a private mount namespace over a tmpfs /opt: the host's /opt is never written.
- `UNIT_TEST=true`: its only effect is that the os-release of /host-etc (the image mounts the host's) is read as
  empty (controllers/object_controls.go:963-988); the driver state then reads the OS from NFD's node labels.
- No `--leader-elect` (one replica, no in-pod namespace file); probes and metrics on loopback ports.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from common.names import CLUSTER_POLICIES_PATH, DEFAULT_CLUSTER_POLICY
from e2e.build import LINKS, MODULES, go
from e2e.controlplane import ControlPlane, free_port, poll

MODULE = "github.com/NVIDIA/gpu-operator"
NAMESPACE = "gpu-operator"
SERVICE_ACCOUNT = "gpu-operator"
IDENTITY = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
CLUSTER_POLICY = DEFAULT_CLUSTER_POLICY  # the chart's name for it
PROCESS = "gpu-operator"
# The DaemonSet of the operator's own device plugin (assets/state-device-plugin/0500_daemonset.yaml).
PLUGIN_DAEMONSET = "nvidia-device-plugin-daemonset"
# Labels NFD gives an NVIDIA GPU node, all the operator reads before it deploys to one: the PCI vendor
# (state_manager.go:113-117), and with the chart's default driver.enabled the kernel and OS (the driver state stops
# every reconcile without them). A real kubelet's containerd version (getRuntimeString, state_manager.go:583-597).
NFD_LABELS = {
    "feature.node.kubernetes.io/pci-10de.present": "true",
    "feature.node.kubernetes.io/kernel-version.full": "6.8.0-45-generic",
    "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID": "24.04",
}
CONTAINER_RUNTIME = "containerd://2.4.2"


def module_dir() -> Path:
    """The operator's module, the version e2e/go/gpuoperator pins, from Go's module cache (downloaded if missing)."""
    return Path(json.loads(go("mod", "download", "-json", MODULE, cwd=MODULES / "gpuoperator"))["Dir"])


def crds(module: Path) -> list[dict[str, Any]]:
    return [
        yaml.safe_load(path.read_text()) for path in sorted((module / "deployments/gpu-operator/crds").glob("*.yaml"))
    ]


# The only template constructs in the chart's RBAC files at this commit: a label include, one `if` on a value, and
# the release namespace. Anything else fails loudly here, so a new pin cannot slip a half-read object through.
_INCLUDE = re.compile(r"^\s*\{\{-? include .*\}\}\s*$")
_IF = re.compile(r"^\{\{-? if \.Values\.operator\.cleanupCRD \}\}$")
_END = re.compile(r"^\{\{-? end \}\}$")


def _resolved(text: str, values: dict[str, Any]) -> dict[str, Any]:
    lines, keep = [], True
    for line in text.splitlines():
        if _INCLUDE.match(line):
            continue
        if _IF.match(line.strip()):
            keep = bool(values["operator"].get("cleanupCRD"))
            continue
        if _END.match(line.strip()):
            keep = True
            continue
        resolved = line.replace("{{ $.Release.Namespace }}", NAMESPACE)
        if "{{" in resolved:
            raise ValueError(f"an unexpected template construct in the chart's RBAC: {line.strip()}")
        if keep:
            lines.append(resolved)
    return dict(yaml.safe_load("\n".join(lines)))


def rbac(module: Path) -> list[dict[str, Any]]:
    """The chart's ServiceAccount, ClusterRole, ClusterRoleBinding, Role and RoleBinding."""
    chart = module / "deployments/gpu-operator"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    names = ("serviceaccount", "clusterrole", "clusterrolebinding", "role", "rolebinding")
    objects = [_resolved((chart / "templates" / f"{name}.yaml").read_text(), values) for name in names]
    for obj in objects:
        if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            obj["metadata"]["namespace"] = NAMESPACE
    return objects


def _pruned(value: Any, schema: dict[str, Any]) -> Any:
    """`value` cut to what `schema` (a structural OpenAPI schema) declares; nulls dropped."""
    if isinstance(value, dict) and schema.get("type") == "object":
        if "properties" in schema:
            properties = schema["properties"]
            return {k: _pruned(v, properties[k]) for k, v in value.items() if k in properties and v is not None}
        if isinstance(schema.get("additionalProperties"), dict):
            return {k: _pruned(v, schema["additionalProperties"]) for k, v in value.items() if v is not None}
        return value if schema.get("x-kubernetes-preserve-unknown-fields") else {}
    if isinstance(value, list) and schema.get("type") == "array":
        return [_pruned(v, schema.get("items") or {}) for v in value if v is not None]
    return value


def cluster_policy(module: Path, **changes: dict[str, Any]) -> dict[str, Any]:
    """The chart's default ClusterPolicy: values.yaml, cut to the CRD's spec schema; `changes` replaces sections."""
    chart = module / "deployments/gpu-operator"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    crd = yaml.safe_load((chart / "crds/nvidia.com_clusterpolicies.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    spec_schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    # The one value the chart's ClusterPolicy template defaults from the chart (templates/clusterpolicy.yaml:72).
    chart_version = yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"]
    values["validator"].setdefault("version", chart_version)
    spec = _pruned({**values, **changes}, spec_schema)
    return {"apiVersion": f"nvidia.com/{version['name']}", "kind": "ClusterPolicy",
            "metadata": {"name": CLUSTER_POLICY}, "spec": spec}  # fmt: skip


def install(plane: ControlPlane, module: Path, **changes: dict[str, Any]) -> None:
    """The CRDs, the chart's RBAC and ClusterPolicy (created, as Helm does: a server-side apply of the chart's
    policy is refused by the CRD), and a token of the chart's service account for the operator."""
    for crd in crds(module):
        plane.apply(crd)
    poll(lambda: plane.get_or_none(CLUSTER_POLICIES_PATH) is not None, 30, "the ClusterPolicy CRD")
    if plane.get_or_none(f"/api/v1/namespaces/{NAMESPACE}") is None:
        plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    for obj in rbac(module):
        plane.apply(obj)
    plane.create(cluster_policy(module, **changes))
    token = plane.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{SERVICE_ACCOUNT}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}},
    )
    plane.tokens[IDENTITY] = token["status"]["token"]


def start(plane: ControlPlane, module: Path) -> None:
    """The operator as a process of the plane (its output in gpu-operator.log), in its own mount namespace with the
    module's assets at /opt/gpu-operator; returns once its health probe answers."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise RuntimeError("the GPU Operator's tier needs unshare (util-linux) and root for a private mount namespace")
    probe = free_port()
    # The assets directory holds the states; the driver state's manifests sit under manifests/ beside them.
    script = (
        "set -e; mount -t tmpfs -o size=1m hidden-gpu-opt /opt; mkdir -p /opt/gpu-operator; "
        f"for d in {module}/assets/*; do mkdir -p /opt/gpu-operator/$(basename $d); "
        "mount --bind -o ro $d /opt/gpu-operator/$(basename $d); done; "
        f"mkdir -p /opt/gpu-operator/manifests; mount --bind -o ro {module}/manifests /opt/gpu-operator/manifests; "
        'exec "$0" "$@"'
    )
    plane.spawn(
        PROCESS,
        Path(unshare),
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        str(LINKS / "gpu-operator"),
        f"--health-probe-bind-address=127.0.0.1:{probe}",
        "--metrics-bind-address=0",
        f"--kubeconfig={plane.kubeconfig(IDENTITY)}",
        env={
            "OPERATOR_NAMESPACE": NAMESPACE,
            "WATCH_NAMESPACE": "",
            "UNIT_TEST": "true",
            "PATH": "/usr/bin:/bin",
            "DRIVER_MANAGER_IMAGE": _driver_manager_image(module),
        },
    )
    wait_healthy(plane)


def _driver_manager_image(module: Path) -> str:
    """The chart's DRIVER_MANAGER_IMAGE env (templates/operator.yaml, _helpers.tpl driver-manager.fullimage)."""
    manager = yaml.safe_load((module / "deployments/gpu-operator/values.yaml").read_text())["driver"]["manager"]
    return f"{manager['repository']}/{manager['image']}:{manager['version']}"


def wait_healthy(plane: ControlPlane, seconds: float = 60) -> None:
    # The probe's address, from the command line the process was started (or restarted) with.
    flag = "--health-probe-bind-address="
    address = next(a for a in plane.processes.commands[PROCESS] if a.startswith(flag)).removeprefix(flag)

    def healthy() -> bool:
        if plane.processes.running[PROCESS].poll() is not None:
            raise RuntimeError(f"the GPU Operator exited: {plane.log(PROCESS)[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://{address}/readyz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    poll(healthy, seconds, "the GPU Operator's readiness probe", interval=0.2)


def restart(plane: ControlPlane) -> float:
    """Stop the operator and start it again; the seconds until its probe answered."""
    started = time.monotonic()
    plane.restart(PROCESS)
    wait_healthy(plane)
    return time.monotonic() - started


def touch(plane: ControlPlane) -> None:
    """A ClusterPolicy spec change (its watch reconciles on a new generation only): a devicePlugin env entry."""
    path = f"{CLUSTER_POLICIES_PATH}/{CLUSTER_POLICY}"
    policy = plane.request("GET", path)
    env = [e for e in policy["spec"]["devicePlugin"].get("env") or [] if e.get("name") != "HIDDEN_GPU_TOUCH"]
    env.append({"name": "HIDDEN_GPU_TOUCH", "value": str(time.monotonic_ns())})
    plane.request("PATCH", path, {"spec": {"devicePlugin": {"env": env}}}, content_type="application/merge-patch+json")


def plugin_pods(plane: ControlPlane) -> dict[str, str]:
    """The operator's device-plugin pods: node -> pod name."""
    pods = plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app%3D{PLUGIN_DAEMONSET}")
    return {p["spec"].get("nodeName", ""): p["metadata"]["name"] for p in pods["items"]}


def daemonsets(plane: ControlPlane) -> Iterator[dict[str, Any]]:
    yield from plane.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets")["items"]


def log_tail(plane: ControlPlane, chars: int = 4000) -> str:
    return plane.log(PROCESS)[-chars:]
