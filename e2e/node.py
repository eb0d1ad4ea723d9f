"""A real GPU node's software without a GPU, registered to a running e2e.controlplane.ControlPlane: containerd
(CRI) with runtimes `runc` and `nvidia` (NVIDIA's container runtime in CDI mode in front of runc), a kubelet,
a CNI stub, and a synthetic CDI spec whose `nvidia.com/gpu` devices are the node's GPU UUIDs (and `all`).
The spec is the one stand-in for a GPU: each device's edits inject a marker a container can print (a variable
HIDDEN_GPU_TEST_GPU_<n>=<uuid> and a file /run/hidden-gpu-test/gpus/<uuid>), where a real spec injects
device nodes and the driver's libraries.

    with Node.start(plane, bin_dir, "gpu-node-01", uuids) as node:
        node.toolkit(Toolkit(envvar_when_unprivileged=False, volume_mounts=True))  # read at each container start
        node.logs("default", "probe")

On a GPU host (lab/gpu_node_run.py) the same node runs over the host's real CDI spec and other images:
`cdi` writes the spec into the node's spec directory (`nvidia-ctk cdi generate`) in place of the synthetic one,
and `own_images` replaces the images imported (NVIDIA's plugin, a pod image that runs nvidia-smi).

Everything lives under one temporary directory, except what the kubelet keeps at fixed paths:
/var/lib/kubelet/device-plugins (the kubelet's registration socket and its checkpoint, where device plugins
look whatever --root-dir says), emptied at start and stop; and /var/lib/kubelet/pod-resources, plugins_registry and
plugins, links to the kubelet's own while it runs, where the rendered dcgm-exporter and DRA kubelet plugin mount them
from. Needs root, Linux, and e2e.build's binaries.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e import images
from e2e.containerd import containerd_config, socket_of, tier_images, write_cni
from e2e.controlplane import ApiError, ControlPlane, free_port
from e2e.host_state import empty_dir, remove_pod_cgroups, unlink_link, unmount_under
from e2e.node_gpus import CDI_KIND, DEFAULTS, Toolkit, cdi_spec
from e2e.processes import Processes

DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
CHECKPOINT = DEVICE_PLUGINS / "kubelet_internal_checkpoint"
# Where a cluster's kubelet serves PodResources (its --root-dir is /var/lib/kubelet) and the render mounts it from.
POD_RESOURCES = Path("/var/lib/kubelet/pod-resources")
# Where a cluster's kubelet takes DRA plugins' registrations and keeps their sockets, and the rendered DRA kubelet
# plugin mounts them from (its sockets' paths must be the same on the host): links to the kubelet's own while it runs.
KUBELET_LINKS = (POD_RESOURCES, Path("/var/lib/kubelet/plugins_registry"), Path("/var/lib/kubelet/plugins"))
# The kubelet sets these on start unless protectKernelDefaults (pkg/kubelet/cm/container_manager_linux.go,
# setupKernelTunables); restored at stop.
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
READY_SECONDS = 120.0


@dataclass
class Node:
    name: str
    root: Path
    bin_dir: Path
    plane: ControlPlane
    uuids: list[str]
    snapshotter: str = "overlayfs"
    processes: Processes = field(init=False)
    timings: dict[str, float] = field(default_factory=dict)
    sysctls: dict[str, str] = field(default_factory=dict)
    cdi: Callable[[Path], None] | None = None
    """Writes the CDI spec(s) into the directory given; None: the synthetic spec of `uuids`."""
    own_images: Sequence[tuple[images.Image, dict[str, Path]]] | None = None
    """The images to import (image, its files); None: the node tier's pause, probe, the stand-ins of NVIDIA's plugin,
    GFD and dcgm-exporter, and of the GPU Operator's plugin and validator."""
    host_cdi: bool = False
    """containerd also reads the host's /var/run/cdi, where NVIDIA's DRA kubelet plugin writes a spec per claim."""

    def __post_init__(self) -> None:
        self.processes = Processes(self.root)

    @classmethod
    @contextmanager
    def start(
        cls,
        plane: ControlPlane,
        bin_dir: Path,
        name: str,
        uuids: list[str],
        toolkit: Toolkit = DEFAULTS,
        *,
        cdi: Callable[[Path], None] | None = None,
        own_images: Sequence[tuple[images.Image, dict[str, Path]]] | None = None,
        host_cdi: bool = False,
    ) -> Iterator[Node]:
        """A registered, Ready node named `name` (its kubelet authenticates as system:node:<name>, which the plane
        must know: ControlPlane.start(identities=...)); everything stopped and removed afterwards. `cdi` and
        `own_images`: see the fields."""
        if os.geteuid() != 0:
            raise RuntimeError("the node tier runs containerd and a kubelet: it needs root")
        if (DEVICE_PLUGINS / "kubelet.sock").exists():
            raise RuntimeError(f"{DEVICE_PLUGINS}/kubelet.sock exists: another kubelet runs on this machine")
        root = Path(tempfile.mkdtemp(prefix="hidden-gpu-node-"))
        overlay = "overlay" in Path("/proc/filesystems").read_text()
        node = cls(
            name,
            root,
            bin_dir,
            plane,
            list(uuids),
            "overlayfs" if overlay else "native",
            cdi=cdi,
            own_images=own_images,
            host_cdi=host_cdi,
        )
        try:
            node._start(toolkit)
            yield node
        finally:
            node.stop()
            shutil.rmtree(root, ignore_errors=True)

    # --- start ---------------------------------------------------------------------------------------------

    def _start(self, toolkit: Toolkit) -> None:
        started = time.monotonic()
        for sysctl in KUBELET_SYSCTLS:
            self.sysctls[sysctl] = (Path("/proc/sys") / sysctl).read_text().strip()
        empty_dir(DEVICE_PLUGINS)
        self._write_gpus()
        self.toolkit(toolkit)
        write_cni(self.root / "cni")
        self._start_containerd()
        self._import_images()
        self.timings["containerd"] = time.monotonic() - started
        self._start_kubelet()
        self.wait_ready()
        for link in KUBELET_LINKS:
            unlink_link(link)
            link.symlink_to(self.kubelet_root / link.name)
        self.timings["ready"] = time.monotonic() - started

    def _write_gpus(self) -> None:
        if self.cdi is not None:
            (self.root / "cdi").mkdir()
            self.cdi(self.root / "cdi")
            return
        files = self.root / "gpus"
        files.mkdir()
        for uuid in self.uuids:
            (files / uuid).write_text(uuid + "\n")
        (self.root / "cdi").mkdir()
        (self.root / "cdi" / "hidden-gpu-test.json").write_text(json.dumps(cdi_spec(self.uuids, files), indent=1))

    def toolkit(self, settings: Toolkit) -> None:
        """(Re)write NVIDIA's container runtime config: mode cdi over our spec, runc behind it. It is read at every
        container creation (nvidia-container-runtime reads it per call), so a change needs no restart."""
        directory = self.root / "toolkit"
        directory.mkdir(exist_ok=True)
        config = directory / "config.toml"
        envvar, mounts = (
            str(setting).lower() for setting in (settings.envvar_when_unprivileged, settings.volume_mounts)
        )
        config.write_text(
            f"accept-nvidia-visible-devices-envvar-when-unprivileged = {envvar}\n"
            f"accept-nvidia-visible-devices-as-volume-mounts = {mounts}\n\n"
            "[nvidia-container-runtime]\n"
            f'debug = "{directory}/nvidia-container-runtime.log"\n'
            'log-level = "info"\n'
            'mode = "cdi"\n'
            f'runtimes = ["{self.bin_dir / "runc"}"]\n\n'
            "[nvidia-container-runtime.modes.cdi]\n"
            f'default-kind = "{CDI_KIND}"\n'
            f'spec-dirs = ["{self.root / "cdi"}"]\n'
        )
        wrapper = directory / "nvidia-runtime"
        wrapper.write_text(
            f"#!/bin/sh\nexport NVIDIA_CTK_CONFIG_FILE_PATH={config}\n"
            f'exec {self.bin_dir.resolve() / "nvidia-container-runtime"} "$@"\n'
        )
        wrapper.chmod(0o755)

    @property
    def containerd_socket(self) -> Path:
        return socket_of(self.root)

    def _start_containerd(self) -> None:
        config = self.root / "containerd/config.toml"
        config.parent.mkdir(exist_ok=True)
        cdi = [self.root / "cdi", *([Path("/var/run/cdi")] if self.host_cdi else [])]
        config.write_text(containerd_config(self.root, self.bin_dir, self.snapshotter, cdi))
        # The shim is found on PATH (containerd-shim-runc-v2 beside containerd).
        env = {**os.environ, "PATH": f"{self.bin_dir.resolve()}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        self.processes.spawn("containerd", [str(self.bin_dir / "containerd"), "--config", str(config)], env)
        self._wait(self.containerd_socket.exists, "containerd's socket", 30)

    def _import_images(self) -> None:
        directory = self.root / "images"
        directory.mkdir()
        for image, files in self.own_images or tier_images(self.bin_dir):
            archive = images.oci_archive(image, files, directory)
            images.import_archive(self.bin_dir / "ctr", self.containerd_socket, archive, self.snapshotter)

    def restart_kubelet(
        self, node_labels: dict[str, str] | None = None, *, before: Callable[[], None] = lambda: None
    ) -> None:
        """Stop the kubelet, run `before` (say, delete the Node object), start it again with `--node-labels` when
        given, and wait until the node is Ready: a reinstall or a kubelet upgrade. Containers keep running; device
        plugins see kubelet.sock created anew and register again."""
        self.processes.terminate("kubelet", 15)
        before()
        self._start_kubelet(node_labels)
        self.wait_ready()

    def _start_kubelet(self, node_labels: dict[str, str] | None = None) -> None:
        k = self.root / "kubelet"
        k.mkdir(exist_ok=True)
        identity = f"system:node:{self.name}"
        # The kubelet's own rights: the system:node role for its group (the API server here authorizes with RBAC
        # only, without the Node authorizer; NodeRestriction admission still limits it to its own node and pods).
        with suppress(ApiError):  # already bound by an earlier node of this plane
            self.plane.request(
                "POST",
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                {
                    "metadata": {"name": "hidden-gpu-e2e-nodes"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
                },
            )
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.plane.root / "pki/ca.crt")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",  # no systemd here
            "failSwapOn": False,
            "failCgroupV1": False,  # CI's machine mounts cgroup v1 (tmpfs at /sys/fs/cgroup)
            "resolvConf": "",
            "enforceNodeAllocatable": [],
            "imageGCHighThresholdPercent": 100,  # keep the imported images: none can be pulled
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "podLogsDir": str(self.root / "pod-logs"),
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "5s",
        }
        (k / "config.yaml").write_text(yaml.safe_dump(config))
        self.processes.spawn(
            "kubelet",
            [str(self.bin_dir / "kubelet"), f"--config={k / 'config.yaml'}",
             f"--kubeconfig={self.plane.kubeconfig(identity)}", f"--root-dir={self.kubelet_root}",
             f"--cert-dir={k / 'pki'}", f"--hostname-override={self.name}", "--v=1",
             *([f"--node-labels={','.join(f'{key}={value}' for key, value in node_labels.items())}"]
               if node_labels else [])],
            dict(os.environ),
        )  # fmt: skip

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet/root"

    def audit_sources(self, tmp: Path) -> list[str]:
        """host.audit's flags for this node: the kubelet's PodResources socket and a log root laid out as /var/log
        (the kubelet's podLogsDir where /var/log/pods would be; the container links it keeps at a fixed path)."""
        logs = tmp / "log"
        if not logs.exists():
            logs.mkdir()
            (logs / "pods").symlink_to(self.root / "pod-logs")
            (logs / "containers").symlink_to("/var/log/containers")
        return [
            "--log-root",
            str(logs),
            "--pod-resources-socket",
            str(self.kubelet_root / "pod-resources/kubelet.sock"),
        ]

    def start_dra_plugin(self, kubeconfig: Path, driver: str, gpus: list[str]) -> None:
        """The stand-in for NVIDIA's DRA kubelet plugin (e2e/go/dra) as a host process, where NVIDIA's runs as a pod
        with the same directories mounted: it registers through the kubelet's plugins_registry and publishes `gpus`
        (each GPU's minor number is its place there) in a ResourceSlice for this node, as `kubeconfig`'s identity."""
        data = self.kubelet_root / "plugins" / driver
        data.mkdir(parents=True, exist_ok=True)
        self.processes.spawn(
            "dra-plugin",
            [str(self.bin_dir / "hidden-gpu-test-dra-plugin"), f"--kubeconfig={kubeconfig}", f"--node={self.name}",
             f"--driver={driver}", f"--gpus={','.join(gpus)}",
             f"--registrar-dir={self.kubelet_root / 'plugins_registry'}", f"--plugin-dir={data}"],
            dict(os.environ),
        )  # fmt: skip

    def stop_dra_plugin(self) -> None:
        self.processes.terminate("dra-plugin", 15)

    def log(self, name: str) -> str:
        return self.processes.log(name)

    def _wait(self, check: Any, what: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not check():
            if exited := self.processes.exited():
                raise RuntimeError(exited)
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {n}\n{self.log(n)[-2000:]}" for n in self.processes.running)
                raise RuntimeError(f"{what} not reached in {seconds} s\n{logs}")
            time.sleep(0.3)

    def node(self) -> dict[str, Any]:
        result: dict[str, Any] = self.plane.request("GET", f"/api/v1/nodes/{self.name}")
        return result

    def allocatable(self, resource: str = "nvidia.com/gpu") -> int:
        """The node's allocatable count of `resource`, as its kubelet last reported it."""
        return int(self.node()["status"].get("allocatable", {}).get(resource, "0"))

    def wait_ready(self) -> None:
        """Registered, Ready, and without the not-ready taint (the node lifecycle controller lifts it)."""

        def ready() -> bool:
            try:
                node = self.node()
            except ApiError:
                return False
            conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            return conditions.get("Ready") == "True" and not node.get("spec", {}).get("taints")

        self._wait(ready, f"node {self.name} Ready and untainted", READY_SECONDS)

    # --- what tests read -----------------------------------------------------------------------------------

    def logs(self, namespace: str, pod: str, container: str | None = None) -> list[str]:
        """A container's output, read from the kubelet's podLogsDir (CRI log format) rather than through
        pods/log, which would need the API server to trust the kubelet's serving certificate."""
        obj = self.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}")
        container = container or obj["spec"]["containers"][0]["name"]
        directory = self.root / "pod-logs" / f"{namespace}_{pod}_{obj['metadata']['uid']}" / container
        lines: list[str] = []
        for path in sorted(directory.glob("*.log")) if directory.is_dir() else []:
            for line in path.read_text(errors="replace").splitlines():
                parts = line.split(" ", 3)  # <time> <stream> <P|F> <text>
                if len(parts) == 4:
                    lines.append(parts[3])
        return lines

    def checkpoint(self) -> dict[str, Any]:
        """The kubelet's device manager checkpoint: {"Data": {"PodDeviceEntries": [...], "RegisteredDevices":
        {resource: [ids]}}, "Checksum": ...} (pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go)."""
        if not CHECKPOINT.exists():
            return {}
        data: dict[str, Any] = json.loads(CHECKPOINT.read_text()).get("Data", {})
        return data

    # --- stop ----------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """The kubelet first, then every container (ctr), containerd, leftover mounts, the kubelet's pod cgroups;
        the device-plugins directory emptied and the kubelet's sysctls restored."""
        self.processes.terminate("dra-plugin", 15)
        self.processes.terminate("kubelet", 15)
        if "containerd" in self.processes and self.processes.running["containerd"].poll() is None:
            self._remove_containers()
        self.processes.terminate("containerd", 15)
        unmount_under(self.root)
        remove_pod_cgroups()
        empty_dir(DEVICE_PLUGINS)
        for link in KUBELET_LINKS:
            unlink_link(link)
        for sysctl, value in self.sysctls.items():
            with suppress(OSError):
                (Path("/proc/sys") / sysctl).write_text(value)

    def _ctr(self, *args: str) -> str:
        result = subprocess.run(
            [str(self.bin_dir / "ctr"), "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        return result.stdout

    def _remove_containers(self) -> None:
        for line in self._ctr("tasks", "ls").splitlines()[1:]:
            task = line.split()[0]
            self._ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task)
        for line in self._ctr("tasks", "ls").splitlines()[1:]:
            self._ctr("tasks", "delete", "--force", line.split()[0])
        for container in self._ctr("containers", "ls", "--quiet").split():
            self._ctr("containers", "delete", container)
