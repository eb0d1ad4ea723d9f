"""A real Kubernetes control plane on loopback, for the real test tier: etcd on tmpfs, kube-apiserver with
its own CA, token authentication, RBAC and the admission plugins a production cluster runs,
kube-controller-manager and kube-scheduler. Like controller-runtime's envtest (binaries in one
directory, generated certificates, an admin identity), but it also runs the controllers and the
scheduler, so DaemonSets get pods, pods get nodes and quotas get counted.

    with ControlPlane.start(bin_dir) as plane:
        plane.kubeconfig("admin")   # a kubeconfig file for an identity of tokens.csv
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import yaml

from e2e.processes import Processes

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

# What the API server's audit log names the testbed's own requests by, apart from the engine's and the tools'.
USER_AGENT = "hidden-gpu-testbed"

# Identities of the token file: name -> (groups). The tenant gets `edit` in its namespaces only.
IDENTITIES = {
    "admin": ["system:masters"],
    "system:kube-controller-manager": [],
    "system:kube-scheduler": [],
    "tenant": ["hidden-gpu:tenants"],
}
SERVICE_RANGE = "10.96.0.0/24"
# What a production API server admits with (kube-apiserver's defaults plus NodeRestriction and PodSecurity
# made explicit); ValidatingAdmissionPolicy and MutatingAdmissionPolicy are on by default from 1.30 and 1.36.
ADMISSION_PLUGINS = (
    "NamespaceLifecycle,LimitRanger,ServiceAccount,NodeRestriction,PodSecurity,Priority,RuntimeClass,"
    "DefaultTolerationSeconds,MutatingAdmissionPolicy,ValidatingAdmissionPolicy,ResourceQuota"
)
CONTROLLERS = (
    "daemonset-controller,resourcequota-controller,serviceaccount-controller,serviceaccount-token-controller,"
    "namespace-controller,garbage-collector-controller,validatingadmissionpolicy-status-controller,"
    "clusterrole-aggregation-controller"
)
READY_SECONDS = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(directory: Path) -> None:
    """A CA, the API server's serving certificate for 127.0.0.1, and the service-account key pair."""
    directory.mkdir(parents=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=hidden-gpu-e2e-ca", cwd=directory)  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
             "-subj", "/CN=kube-apiserver", cwd=directory)  # fmt: skip
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "apiserver.crt", "-days", "2", "-extfile", "san.cnf", cwd=directory)  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)


@dataclass
class ControlPlane:
    root: Path
    url: str
    tokens: dict[str, str]
    processes: Processes = field(init=False)
    _plurals: dict[tuple[str, str], tuple[str, bool]] = field(default_factory=dict)
    _clients: dict[str, ApiClient] = field(default_factory=dict, repr=False)
    groups: dict[str, list[str]] = field(default_factory=lambda: dict(IDENTITIES))

    def __post_init__(self) -> None:
        self.processes = Processes(self.root)

    @classmethod
    @contextmanager
    def start(
        cls,
        bin_dir: Path,
        *,
        controllers: tuple[str, ...] = (),
        identities: dict[str, list[str]] | None = None,
        minor: str = "",
    ) -> Iterator[ControlPlane]:
        """Everything under one tmpfs directory, removed afterwards; every process stopped, even on failure.

        `controllers` runs more kube-controller-manager controllers than CONTROLLERS (the node tier adds
        node-lifecycle-controller); `identities` adds token identities (name -> groups), e.g. a kubelet's
        `system:node:<node>` in `system:nodes`. `minor` ("1.35") runs that minor's API server (`kube-apiserver-1.35`
        in bin_dir) and nothing beside it and etcd: no controller manager, no scheduler."""
        base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        root = Path(tempfile.mkdtemp(prefix="hidden-gpu-e2e-", dir=base))
        groups = {**IDENTITIES, **(identities or {})}
        plane = cls(root, "", {name: os.urandom(16).hex() for name in groups}, groups=groups)
        try:
            plane._start(bin_dir, controllers, minor=minor)
            yield plane
        finally:
            plane.stop()
            shutil.rmtree(root, ignore_errors=True)

    def _start(
        self,
        bin_dir: Path,
        controllers: tuple[str, ...] = (),
        *,
        minor: str = "",
    ) -> None:
        pki = self.root / "pki"
        make_pki(pki)
        (self.root / "tokens.csv").write_text(
            "".join(
                f"{self.tokens[name]},{name},{name}{',' + json.dumps(','.join(groups)) if groups else ''}\n"
                for name, groups in self.groups.items()
            )
        )
        (self.root / "audit.yaml").write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n")
        etcd_client, etcd_peer, api = free_port(), free_port(), free_port()
        self.url = f"https://127.0.0.1:{api}"
        self.spawn("etcd", bin_dir / "etcd", "--name", "e2e", "--data-dir", str(self.root / "etcd"),
                    "--unsafe-no-fsync", "--listen-client-urls", f"http://127.0.0.1:{etcd_client}",
                    "--advertise-client-urls", f"http://127.0.0.1:{etcd_client}",
                    "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
                    "--initial-cluster", f"e2e=http://127.0.0.1:{etcd_peer}", "--log-level", "warn")  # fmt: skip
        self.spawn("kube-apiserver", bin_dir / (f"kube-apiserver-{minor}" if minor else "kube-apiserver"),
                    f"--etcd-servers=http://127.0.0.1:{etcd_client}", "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1", f"--secure-port={api}",
                    # v1.37 refuses a loopback advertise address with the default (lease) endpoint reconciler
                    # (k8s.io/kubernetes v1.37.2 pkg/controlplane/instance.go:354-356); no client here needs the
                    # `kubernetes` Service's endpoints.
                    "--endpoint-reconciler-type=none",
                    f"--tls-cert-file={pki}/apiserver.crt", f"--tls-private-key-file={pki}/apiserver.key",
                    f"--client-ca-file={pki}/ca.crt", f"--token-auth-file={self.root}/tokens.csv",
                    "--anonymous-auth=false", "--authorization-mode=RBAC", "--allow-privileged=true",
                    f"--service-cluster-ip-range={SERVICE_RANGE}", f"--service-account-issuer={self.url}",
                    f"--service-account-key-file={pki}/sa.pub", f"--service-account-signing-key-file={pki}/sa.key",
                    f"--enable-admission-plugins={ADMISSION_PLUGINS}", "--profiling=false",
                    f"--audit-policy-file={self.root}/audit.yaml", f"--audit-log-path={self.root}/audit.log",
                    "--v=0")  # fmt: skip
        self.wait_ready()
        for component in () if minor else ("kube-controller-manager", "kube-scheduler"):
            identity = f"system:{component}"  # the identities tokens.csv gives them
            extra = (
                [f"--controllers={','.join((CONTROLLERS, *controllers))}",
                 f"--service-account-private-key-file={pki}/sa.key", f"--root-ca-file={pki}/ca.crt",
                 "--use-service-account-credentials=true"]
                if component == "kube-controller-manager"
                else []
            )  # fmt: skip
            self.spawn(component, bin_dir / component, f"--kubeconfig={self.kubeconfig(identity)}",
                        "--leader-elect=false", "--secure-port=0", *extra)  # fmt: skip

    def spawn(self, name: str, binary: Path, *args: str, env: dict[str, str] | None = None) -> None:
        """A process of the plane, or one more beside its own (the real tier's kwok): logged to `<name>.log`
        (log()), restarted by restart(), stopped newest first by stop()."""
        self.processes.spawn(name, [str(binary), *args], env)

    def kill(self, name: str) -> None:
        """SIGKILL one component, as a crash or a lost machine would end it: no graceful shutdown."""
        self.processes.kill(name)

    def restart(self, name: str) -> None:
        """Start a killed component again with its first command line; for the API server, wait until ready."""
        self.processes.restart(name)
        if name == "kube-apiserver":
            self.wait_ready()

    def log(self, name: str) -> str:
        return self.processes.log(name)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_SECONDS
        while True:
            try:
                if self.request("GET", "/readyz", raw=True) == "ok":
                    return
            except (OSError, ApiError):
                pass
            if exited := self.processes.exited():
                raise RuntimeError(exited)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"kube-apiserver not ready in {READY_SECONDS} s: {self.log('kube-apiserver')[-3000:]}"
                )
            time.sleep(0.3)

    def stop(self) -> None:
        self.processes.stop()

    def kubeconfig(self, identity: str) -> Path:
        """A kubeconfig file for one identity; its context is named `<identity>@e2e`."""
        path = self.root / f"{identity.replace(':', '_')}.kubeconfig"
        context = f"{identity}@e2e"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "e2e", "cluster": {"server": self.url, "certificate-authority": str(self.root / "pki/ca.crt")}}
            ],
            "users": [{"name": identity, "user": {"token": self.tokens[identity]}}],
            "contexts": [{"name": context, "context": {"cluster": "e2e", "user": identity}}],
            "current-context": context,
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def path(self, obj: dict[str, Any], *, collection: bool = False) -> str:
        """The REST path of an object (or of its collection), found through API discovery."""
        api_version, kind = obj["apiVersion"], obj["kind"]
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        if (api_version, kind) not in self._plurals:
            for resource in self.request("GET", base)["resources"]:
                if "/" not in resource["name"]:
                    self._plurals[(api_version, resource["kind"])] = (resource["name"], resource["namespaced"])
        plural, namespaced = self._plurals[(api_version, kind)]
        metadata = obj.get("metadata") or {}
        scope = f"/namespaces/{metadata.get('namespace') or 'default'}" if namespaced else ""
        return f"{base}{scope}/{plural}" + ("" if collection else f"/{metadata['name']}")

    def apply(self, obj: dict[str, Any], *, identity: str = "admin", manager: str = "e2e") -> Any:
        """Server-side apply, forced: the object as given becomes this manager's."""
        return self.request(
            "PATCH",
            f"{self.path(obj)}?fieldManager={manager}&force=true",
            obj,
            identity=identity,
            content_type="application/apply-patch+yaml",
        )

    def get_or_none(self, path: str) -> dict[str, Any] | None:
        """The object at `path`, or None where the API server says it does not exist (404)."""
        try:
            return dict(self.request("GET", path))
        except ApiError as error:
            if error.code == 404:
                return None
            raise

    def create(self, obj: dict[str, Any], *, identity: str = "admin", dry_run: bool = False) -> Any:
        query = "?dryRun=All" if dry_run else ""
        return self.request("POST", self.path(obj, collection=True) + query, obj, identity=identity)

    def client(self, identity: str = "admin") -> ApiClient:
        """The `kubernetes` library's client as `identity` (a bearer token of tokens.csv), trusting the plane's CA."""
        # Imported at first use: a GPU host run installs the client from carried wheels first (lab/gpu_host.py).
        from kubernetes.client import ApiClient, Configuration  # noqa: PLC0415

        found = self._clients.get(identity)
        if found is None:
            configuration = Configuration(
                host=self.url, api_key={"BearerToken": self.tokens[identity]}, api_key_prefix={"BearerToken": "Bearer"}
            )
            configuration.ssl_ca_cert = str(self.root / "pki/ca.crt")
            configuration.retries = False  # a test says what it waits for (poll)
            found = self._clients[identity] = ApiClient(configuration)
            found.user_agent = USER_AGENT
        return found

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        identity: str = "admin",
        content_type: str = "application/json",
        raw: bool = False,
    ) -> Any:
        """One API request through the `kubernetes` client; JSON in and out (`raw`: the text). An HTTP error raises
        ApiError with the server's Status; the answer's Warning headers are its `__warnings__`."""
        response = self._sent(method, path, body, identity=identity, content_type=content_type, seconds=60)
        text = self._read(method, path, response.read)
        if response.status >= 400:
            raise _refused(response.status, text)
        if raw:
            return text
        result = json.loads(text) if text else {}
        if isinstance(result, dict):
            result["__warnings__"] = response.getheaders().getlist("Warning")
        return result

    def stream(self, path: str, *, identity: str = "admin", seconds: float = 130) -> Any:
        """A GET read as it comes (a watch): the answer once its headers are in, whose lines are the events. Close it
        when done: a connection with unread data must not go back to the client's pool."""
        response = self._sent("GET", path, None, identity=identity, content_type="application/json", seconds=seconds)
        if response.status >= 400:
            raise _refused(response.status, self._read("GET", path, response.read))
        return response.response

    def _sent(self, method: str, path: str, body: Any, *, identity: str, content_type: str, seconds: float) -> Any:
        resource, _, query = path.partition("?")
        api = self.client(identity)
        serialized = api.param_serialize(
            method=method,
            resource_path=resource,
            query_params=parse_qsl(query, keep_blank_values=True),
            header_params={"Content-Type": content_type} if body is not None else {},
            body=body,
            auth_settings=["BearerToken"],
        )
        return self._read(method, path, lambda: api.call_api(*serialized, _request_timeout=seconds))

    @staticmethod
    def _read(method: str, path: str, read: Callable[[], Any]) -> Any:
        """`read`'s result; a request not sent or not answered is an OSError, as a socket's is (poll waits it out)."""
        import urllib3  # noqa: PLC0415 (the client's transport, imported with it)

        try:
            result = read()
        except urllib3.exceptions.HTTPError as error:
            raise ConnectionError(f"{method} {path.partition('?')[0]}: {error}") from None
        return result.decode(errors="replace") if isinstance(result, bytes) else result


def _refused(code: int, text: str) -> ApiError:
    try:
        status = json.loads(text)
    except ValueError:
        status = {"message": text}
    return ApiError(code, status if isinstance(status, dict) else {"message": text})


class ApiError(Exception):
    def __init__(self, code: int, status: dict[str, Any]) -> None:
        super().__init__(f"{code}: {status.get('message', status)}")
        self.code = code
        self.status = status

    @property
    def message(self) -> str:
        return str(self.status.get("message", ""))


class NotReachedError(RuntimeError):
    """A condition poll() waited for did not come in time."""


def naming(plane: ControlPlane, texts: list[str]) -> dict[str, list[str]]:
    """Every listable resource of the API server (each group's preferred version), by name, and which of `texts` its
    objects name, read as JSON: how a test shows a value is nowhere in the API."""
    groups = [
        "/api/v1",
        *(f"/apis/{g['preferredVersion']['groupVersion']}" for g in plane.request("GET", "/apis")["groups"]),
    ]
    found: dict[str, list[str]] = {}
    for group in groups:
        for resource in plane.request("GET", group)["resources"]:
            if "/" not in resource["name"] and "list" in resource["verbs"]:
                text = json.dumps(plane.request("GET", f"{group}/{resource['name']}"))
                found[resource["name"]] = [t for t in texts if t in text]
    return found


def poll(check: Callable[[], Any], seconds: float, what: str, *, interval: float = 0.25) -> Any:
    """The check's first truthy result, asked every `interval` seconds; an API refusal, a failed assertion, a missing
    key or a connection error counts as not yet. NotReachedError names `what` and the last error or result."""
    deadline = time.monotonic() + seconds
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (ApiError, AssertionError, KeyError, OSError) as error:
            last = error
        time.sleep(interval)
    raise NotReachedError(f"{what} not reached in {seconds} s: {last}")
