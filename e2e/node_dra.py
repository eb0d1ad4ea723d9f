"""DRA on the node tier: the rights of a DRA kubelet plugin, what it publishes, what a claim was given, and the
pod and DaemonSet shapes this tier can run a claim and the pinned DRA plugin in."""

from __future__ import annotations

from typing import Any

from common.names import DRA_API_PATH
from e2e.controlplane import ControlPlane

# The identity and group the stand-in DRA kubelet plugin publishes as (ControlPlane.start(identities=...)).
DRA_DRIVER, DRA_DRIVER_GROUP = "dra-driver", "hidden-gpu:dra-drivers"


def grant_dra_driver(plane: ControlPlane, group: str = DRA_DRIVER_GROUP) -> None:
    """The rights NVIDIA's chart gives its DRA kubelet plugin, in the part the stand-in uses (publish its node's
    ResourceSlices, read the claims it prepares and its Node), bound to `group`."""
    rbac = "rbac.authorization.k8s.io"
    plane.apply(
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": "hidden-gpu-test-dra-driver"},
         "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["*"]},
                   {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
                   {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]}
    )  # fmt: skip
    plane.apply(
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "hidden-gpu-test-dra-driver"},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "hidden-gpu-test-dra-driver"},
         "subjects": [{"apiGroup": rbac, "kind": "Group", "name": group}]}
    )  # fmt: skip


def dra_devices(plane: ControlPlane, node: str, driver: str) -> dict[str, str]:
    """The devices `driver` publishes for `node` in its ResourceSlices: device name -> its `uuid` attribute."""
    query = f"{DRA_API_PATH}/resourceslices?fieldSelector=spec.nodeName%3D{node}"
    return {
        device["name"]: device["attributes"]["uuid"]["string"]
        for piece in plane.request("GET", query)["items"]
        if piece["spec"]["driver"] == driver
        for device in piece["spec"]["devices"]
    }


def claim_results(plane: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    """The allocation results of a ResourceClaim (driver, pool, device, request); [] while unallocated."""
    live = plane.request("GET", f"{DRA_API_PATH}/namespaces/{namespace}/resourceclaims/{name}")
    results: list[dict[str, Any]] = (
        ((live.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
    )
    return results


def on_host_network(daemon_set: dict[str, Any], plane: ControlPlane) -> dict[str, Any]:
    """A DaemonSet whose pods talk to the API server (the pinned DRA kubelet plugin), as this tier can run it: with no
    kube-proxy and no pod network here, on the host's network at the address a Service would have given it."""
    spec = daemon_set["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    host, port = plane.url.removeprefix("https://").split(":")
    for container in spec["containers"]:
        container["env"] = [*container.get("env", []), {"name": "KUBERNETES_SERVICE_HOST", "value": host},
                            {"name": "KUBERNETES_SERVICE_PORT", "value": port}]  # fmt: skip
    return daemon_set


def using_claim(pod: dict[str, Any], claim: str) -> dict[str, Any]:
    """The pod with its first container using ResourceClaim `claim`, under the default runtime: containerd injects a
    claim's CDI devices itself, and under an NVIDIA RuntimeClass the image's NVIDIA_VISIBLE_DEVICES would decide
    too (the guard asks for a request or `void` there, rule gpu-runtime-needs-a-request)."""
    pod["spec"].pop("runtimeClassName", None)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return pod
