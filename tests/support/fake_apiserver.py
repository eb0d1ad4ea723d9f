"""A Kubernetes API server on loopback that answers from a fixed set of objects.

GET of collections (nodes, pods in a namespace or all, config maps, runtimeclasses, validating and
mutating admission policies and bindings, resource quotas) with label selectors (`k=v,...` or a bare
key), `spec.nodeName=` field selectors and limit/continue paging; GET, merge-PATCH and an apply that
names no field (server-side apply's release: labels only that manager owns go) of one node. The real
tier runs the real API server's server-side apply. Responses have the API's shape, so the real
kubernetes client reads them as it would a cluster's. Every request is logged; `faults` makes the
next requests answer with a status (429, 500) or malformed JSON; `patch_faults` makes the next PATCHes go
unanswered (PATCH_FAULTS).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

ADMISSION = "apis/admissionregistration.k8s.io/v1"
COLLECTIONS = {
    "api/v1/nodes": "nodes",
    "api/v1/pods": "pods",
    "api/v1/resourcequotas": "quotas",
    "api/v1/configmaps": "config_maps",
    "apis/node.k8s.io/v1/runtimeclasses": "runtime_classes",
    f"{ADMISSION}/validatingadmissionpolicies": "policies",
    f"{ADMISSION}/validatingadmissionpolicybindings": "bindings",
    f"{ADMISSION}/mutatingadmissionpolicies": "mutating_policies",
    f"{ADMISSION}/mutatingadmissionpolicybindings": "mutating_bindings",
    "apis/resource.k8s.io/v1/deviceclasses": "device_classes",
    "apis/resource.k8s.io/v1/resourceslices": "resource_slices",
    "api/v1/namespaces": "namespaces",
    "api/v1/secrets": "secrets",
    "apis/resource.k8s.io/v1/resourceclaims": "resource_claims",
    "apis/resource.k8s.io/v1/resourceclaimtemplates": "claim_templates",
    "apis/apps/v1/daemonsets": "daemon_sets",
    "api/v1/serviceaccounts": "service_accounts",
    "apis/rbac.authorization.k8s.io/v1/clusterroles": "cluster_roles",
    "apis/rbac.authorization.k8s.io/v1/clusterrolebindings": "cluster_role_bindings",
    "apis/networking.k8s.io/v1/networkpolicies": "network_policies",
}


@dataclass
class Cluster:
    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    quotas: list[dict[str, Any]] = field(default_factory=list)
    config_maps: list[dict[str, Any]] = field(default_factory=list)
    runtime_classes: list[dict[str, Any]] = field(default_factory=list)
    policies: list[dict[str, Any]] = field(default_factory=list)
    bindings: list[dict[str, Any]] = field(default_factory=list)
    mutating_policies: list[dict[str, Any]] = field(default_factory=list)
    mutating_bindings: list[dict[str, Any]] = field(default_factory=list)
    device_classes: list[dict[str, Any]] = field(default_factory=list)
    resource_slices: list[dict[str, Any]] = field(default_factory=list)
    namespaces: list[dict[str, Any]] = field(default_factory=list)
    secrets: list[dict[str, Any]] = field(default_factory=list)
    resource_claims: list[dict[str, Any]] = field(default_factory=list)
    claim_templates: list[dict[str, Any]] = field(default_factory=list)
    daemon_sets: list[dict[str, Any]] = field(default_factory=list)
    service_accounts: list[dict[str, Any]] = field(default_factory=list)
    cluster_roles: list[dict[str, Any]] = field(default_factory=list)
    cluster_role_bindings: list[dict[str, Any]] = field(default_factory=list)
    network_policies: list[dict[str, Any]] = field(default_factory=list)
    # (method, path with query, content type) of every request.
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    # Answers for the next requests, in order: a status code, or "malformed".
    faults: list[int | str] = field(default_factory=list)
    # What happens to the next PATCHes, in order: one of PATCH_FAULTS.
    patch_faults: list[str] = field(default_factory=list)


# A PATCH that goes unanswered: "applied, dropped" (applied, then the connection closes without an answer),
# "dropped" (closed unapplied), "applied, silent" (applied, then no answer for SILENT_SECONDS), "dropped, broken"
# (closed unapplied, and every later request is answered with malformed JSON).
PATCH_FAULTS = ("applied, dropped", "dropped", "applied, silent", "dropped, broken")
SILENT_SECONDS = 5.0


def node(name: str, gpus: int | None, labels: dict[str, str]) -> dict[str, Any]:
    resources = {"cpu": "64", "memory": "1056Gi"} | ({"nvidia.com/gpu": str(gpus)} if gpus is not None else {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "resourceVersion": "1", "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {"capacity": resources, "allocatable": resources},
    }


def pod(
    name: str,
    namespace: str,
    node_name: str,
    labels: dict[str, str],
    *,
    ready: bool = True,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"nodeName": node_name, "containers": [container]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def _selected(obj: dict[str, Any], query: dict[str, str]) -> bool:
    field_selector = query.get("fieldSelector", "")
    if field_selector.startswith("type!="):  # the API server's Secret field selector
        if obj.get("type", "Opaque") == field_selector.removeprefix("type!="):
            return False
    elif field_selector and obj.get("spec", {}).get("nodeName") != field_selector.removeprefix("spec.nodeName="):
        return False
    labels = obj["metadata"].get("labels") or {}
    # Terms: `key=value`, `key` (exists) and `key in (a,b)`; a set's commas are not separators.
    for term in re.split(r",(?![^()]*\))", query.get("labelSelector", "")):
        key, is_in, values = term.partition(" in ")
        if is_in:
            if labels.get(key) not in values.strip("()").split(","):
                return False
        elif term and not (
            (labels.get(term.split("=", 1)[0]) == term.split("=", 1)[1]) if "=" in term else term in labels
        ):
            return False
    return True


def managed_fields(manager: str, labels: list[str], operation: str = "Apply") -> dict[str, Any]:
    """A managedFields entry: `manager` owns these labels."""
    fields: dict[str, Any] = {"f:metadata": {"f:labels": {f"f:{label}": {} for label in labels}}}
    return {"manager": manager, "operation": operation, "fieldsType": "FieldsV1", "fieldsV1": fields}


class _Handler(BaseHTTPRequestHandler):
    cluster: Cluster

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _fault(self) -> bool:
        if not self.cluster.faults:
            return False
        fault = self.cluster.faults.pop(0)
        if fault == "malformed":
            data = b'{"kind": "NodeList", "items": [{"metadata": '
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._send(int(fault), {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": fault})
        return True

    def do_GET(self) -> None:
        self.cluster.requests.append(("GET", self.path, ""))
        if self._fault():
            return
        url = urlparse(self.path)
        path = url.path.strip("/")
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = path.split("/")
        namespace = None
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 5:
            namespace, path = parts[3], f"api/v1/{parts[4]}"
        if parts[0] == "apis" and len(parts) == 6 and parts[3] == "namespaces":
            namespace, path = parts[4], f"apis/{parts[1]}/{parts[2]}/{parts[5]}"
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            found = next((n for n in self.cluster.nodes if n["metadata"]["name"] == parts[3]), None)
            if found is None:
                return self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})
            return self._send(200, found)
        if path not in COLLECTIONS:
            return self._send(404, {"kind": "Status", "apiVersion": "v1", "code": 404})
        items = [
            o
            for o in getattr(self.cluster, COLLECTIONS[path])
            if (namespace is None or o["metadata"].get("namespace") == namespace) and _selected(o, query)
        ]
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or len(items) or 1)
        page = items[start : start + limit]
        more = start + limit < len(items)
        metadata = {"resourceVersion": "7"} | ({"continue": str(start + limit)} if more else {})
        return self._send(200, {"kind": "List", "apiVersion": "v1", "metadata": metadata, "items": page})

    def do_PATCH(self) -> None:
        self.cluster.requests.append(("PATCH", self.path, self.headers.get("Content-Type", "")))
        parts = urlparse(self.path).path.strip("/").split("/")
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        found = next(
            (
                n
                for n in self.cluster.nodes
                if parts[:3] == ["api", "v1", "nodes"] and n["metadata"]["name"] == parts[-1]
            ),
            None,
        )
        if found is None:
            return self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})
        fault = self.cluster.patch_faults.pop(0) if self.cluster.patch_faults else ""
        if fault.startswith("dropped"):
            return self._drop(fault)
        content_type = self.headers.get("Content-Type")
        if content_type not in ("application/merge-patch+json", "application/apply-patch+yaml"):
            return self._send(415, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 415})
        wanted = body.get("metadata", {}).get("resourceVersion")
        if wanted is not None and wanted != found["metadata"].get("resourceVersion"):
            return self._send(409, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409})
        labels = found["metadata"].setdefault("labels", {})
        if content_type == "application/apply-patch+yaml":
            if body.get("metadata", {}).get("labels"):
                return self._send(422, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 422})
            self._release(found, parse_qs(urlparse(self.path).query)["fieldManager"][0])
        for key, value in body.get("metadata", {}).get("labels", {}).items():
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
        found["metadata"]["resourceVersion"] = str(int(found["metadata"].get("resourceVersion", "1")) + 1)
        if fault:
            self._drop(fault)
        else:
            self._send(200, found)
        return None

    def _drop(self, fault: str) -> None:
        """Close the connection without an answer (PATCH_FAULTS)."""
        if fault == "applied, silent":
            time.sleep(SILENT_SECONDS)
        if fault == "dropped, broken":
            self.cluster.faults[:] = ["malformed"] * 100
        self.close_connection = True

    @staticmethod
    def _release(found: dict[str, Any], manager: str) -> None:
        entries = found["metadata"].get("managedFields") or []
        kept = [e for e in entries if e["manager"] != manager]

        def labels_of(group: list[dict[str, Any]]) -> set[str]:
            return {key[2:] for e in group for key in e["fieldsV1"]["f:metadata"]["f:labels"]}

        for label in labels_of([e for e in entries if e["manager"] == manager]) - labels_of(kept):
            found["metadata"]["labels"].pop(label, None)
        found["metadata"]["managedFields"] = kept

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def serve(tmp_path: Path, cluster: Cluster) -> Iterator[Path]:
    """Serve the cluster on 127.0.0.1 and yield a kubeconfig (context admin@test) that points at it."""
    handler = type("Handler", (_Handler,), {"cluster": cluster})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # Polled every 50 ms, not 0.5 s: shutdown() waits for the next poll, and every test that serves pays it.
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kubeconfig_for(f"http://127.0.0.1:{server.server_address[1]}"))
    try:
        yield kubeconfig
    finally:
        server.shutdown()
        server.server_close()


def kubeconfig_for(server: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": server}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "admin@test", "context": {"cluster": "test", "user": "test"}}],
            "current-context": "admin@test",
        }
    )
