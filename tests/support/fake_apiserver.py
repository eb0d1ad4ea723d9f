"""A Kubernetes API server on loopback that answers from a fixed set of objects.

Only what tools.verify reads: GET a node, and list pods (all namespaces or one) filtered by
`spec.nodeName=` field selectors and `k=v,...` label selectors. Responses have the API's shape,
so the real kubernetes client deserialises them as it would a cluster's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse


def node(name: str, gpus: int | None, labels: dict[str, str]) -> dict[str, Any]:
    resources = {"cpu": "64", "memory": "1056Gi"} | ({"nvidia.com/gpu": str(gpus)} if gpus is not None else {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "resourceVersion": "1", "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {"capacity": resources, "allocatable": resources},
    }


def pod(name: str, namespace: str, node_name: str, labels: dict[str, str], ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"}],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


class _Handler(BaseHTTPRequestHandler):
    nodes: dict[str, dict[str, Any]]
    pods: list[dict[str, Any]]
    # (method, path, content type) of every request, for tests that count or inspect them.
    requests: list[tuple[str, str, str]]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_PATCH(self) -> None:
        self.requests.append(("PATCH", self.path, self.headers.get("Content-Type", "")))
        parts = urlparse(self.path).path.strip("/").split("/")
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        found = self.nodes.get(parts[3]) if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4 else None
        if found is None:
            return self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})
        if self.headers.get("Content-Type") != "application/merge-patch+json":
            return self._send(415, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 415})
        wanted = body.get("metadata", {}).get("resourceVersion")
        if wanted is not None and wanted != found["metadata"].get("resourceVersion"):
            return self._send(409, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409})
        labels = found["metadata"].setdefault("labels", {})
        for key, value in body.get("metadata", {}).get("labels", {}).items():
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
        found["metadata"]["resourceVersion"] = str(int(found["metadata"].get("resourceVersion", "1")) + 1)
        return self._send(200, found)

    def do_GET(self) -> None:
        self.requests.append(("GET", self.path, ""))
        url = urlparse(self.path)
        parts = url.path.strip("/").split("/")
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            found = self.nodes.get(parts[3])
            if found is None:
                return self._send(
                    404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
                )
            return self._send(200, found)
        if parts[-1] == "pods":
            namespace = parts[3] if parts[2] == "namespaces" else None
            items = [p for p in self.pods if self._matches(p, namespace, query)]
            return self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
        return self._send(404, {"kind": "Status", "code": 404})

    @staticmethod
    def _matches(pod: dict[str, Any], namespace: str | None, query: dict[str, str]) -> bool:
        if namespace and pod["metadata"]["namespace"] != namespace:
            return False
        field = query.get("fieldSelector", "")
        if field and pod["spec"]["nodeName"] != field.removeprefix("spec.nodeName="):
            return False
        wanted = dict(term.split("=", 1) for term in query.get("labelSelector", "").split(",") if term)
        return all(pod["metadata"]["labels"].get(k) == v for k, v in wanted.items())

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def serve(
    tmp_path: Path,
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    requests: list[tuple[str, str, str]] | None = None,
) -> Iterator[Path]:
    """Serve the objects on 127.0.0.1 and yield a kubeconfig that points at them. Nodes are served
    (and patched) in place; `requests` collects every request made."""
    handler = type(
        "Handler",
        (_Handler,),
        {
            "nodes": {n["metadata"]["name"]: n for n in nodes},
            "pods": pods,
            "requests": [] if requests is None else requests,
        },
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
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
