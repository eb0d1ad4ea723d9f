"""Who uses which GPU on this host, and does any pod reach a GPU the kubelet did not give it?

    python -m host.audit --stack prod --node gpu-node-01 [--json]      # or --stack-file PATH
        [--proc-root /proc] [--log-root /var/log] [--pod-resources-socket PATH]
        [--watch --interval 60 [--metrics-port 9835] [--textfile DIR/hidden_gpu.prom]]

The kubelet's own view (its PodResources socket) is the truth it checks against: the devices the
node can allocate must be exactly the stack's exposed ones, every GPU it handed a container through a
DRA claim (NVIDIA's driver, by minor number) must be an exposed one, and every GPU process of a pod must
run on a device the kubelet allocated to that pod, by its plugin or by a claim. Each NVML process is mapped through
<proc-root>/<pid>/cgroup to its pod UID and container id, and those to names through the kubelet's
log directories. Exit 1 on a violation; warnings do not change the status. Without the socket the
allocation checks are skipped, said so, and a pod on a hidden GPU is still a violation.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from common.cli import (
    EXIT_FINDING,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    UnavailableError,
    UsageError,
    add_stack_source,
    parser,
    port_number,
    positive_seconds,
    run,
    stack_file,
)
from common.names import NVIDIA_DRA_DRIVER, Role
from host.nvml import Gpu, gpu_processes, list_gpus, load_nvml, session, uuids_by_minor
from host.podresources.client import NodeDevices, SocketAbsentError
from host.podresources.client import read as read_pod_resources
from host.report import Report
from host.stack import stack_node

POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# The kubelet names pod cgroups `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_with_underscores>.slice`
# (systemd); a static pod's UID is 32 hex digits without dashes (md5 of its manifest). The container's
# cgroup is its 64-hex id, bare (cgroupfs) or wrapped by the runtime (`cri-containerd-<id>.scope`, ...).
POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice)?(?:/|$)"
)
CONTAINER_ID = re.compile(r"(?:^|/)(?:(?:cri-containerd|crio|docker|containerd)-)?([0-9a-f]{64})(?:\.scope)?$")
# The kubelet's log layout: /var/log/pods/<namespace>_<pod>_<uid>/ and the symlinks
# /var/log/containers/<pod>_<namespace>_<container>-<container id>.log. Names and namespaces are
# DNS names, so they hold no "_".
POD_LOG_DIR = re.compile(r"([^_]+)_([^_]+)_([0-9a-f-]+)")
CONTAINER_LOG = re.compile(r"([^_]+)_([^_]+)_(.+)-([0-9a-f]{64})\.log")
# NVIDIA's DRA driver names a full GPU `gpu-<minor>` in its ResourceSlices (k8s-dra-driver-gpu v0.4.0,
# cmd/gpu-kubelet-plugin/nvlib.go): the minor number NVML reports.
DRA_GPU_DEVICE = re.compile(r"gpu-([0-9]+)")


@dataclass(frozen=True)
class Owner:
    pod_uid: str | None
    container_id: str | None


class ProcessGoneError(Exception):
    """The process exited between NVML's answer and reading its cgroup."""


def owner_from_cgroup(text: str) -> Owner:
    """The pod and container a process belongs to, from the text of /proc/<pid>/cgroup.

    Works for cgroup v1 (one line per hierarchy) and v2 (`0::/path`), and for paths shown
    relative to the reader's cgroup namespace (`/../../kubepods...`).
    """
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        pod = POD_UID.search(path)
        if pod is None:
            continue
        container = CONTAINER_ID.search(path)
        uid = pod.group(1).replace("_", "-")
        return Owner(uid, container.group(1) if container else None)
    return Owner(None, None)


def process_owner(proc_root: Path, pid: int) -> Owner:
    try:
        data = (proc_root / str(pid) / "cgroup").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessGoneError from None
    return owner_from_cgroup(data.decode("utf-8"))  # UnicodeDecodeError: an owner nobody can tell


@dataclass(frozen=True)
class Names:
    """Pod UID -> (namespace, pod) and container id -> container name, from the kubelet's log layout."""

    pods: dict[str, tuple[str, str]] = field(default_factory=dict)
    containers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, log_root: Path) -> Names:
        pods: dict[str, tuple[str, str]] = {}
        containers: dict[str, str] = {}
        for entry in _entries(log_root / "pods"):
            match = POD_LOG_DIR.fullmatch(entry)
            if match:
                pods[match.group(3)] = (match.group(1), match.group(2))
        for entry in _entries(log_root / "containers"):
            match = CONTAINER_LOG.fullmatch(entry)
            if match:
                containers[match.group(4)] = match.group(3)
        return cls(pods, containers)


def _entries(directory: Path) -> list[str]:
    try:
        return [entry.name for entry in directory.iterdir()]
    except OSError:
        return []


@dataclass(frozen=True)
class Sources:
    """Where the audit reads the host: NVML, /proc, the kubelet's logs and its socket."""

    nvml: ModuleType
    proc_root: Path
    log_root: Path
    socket: Path


def check_proc_root(proc_root: Path) -> None:
    """A proc tree with live processes: a copy holding only self/ would report every process "exited"."""
    try:
        live = any(entry.name.isdigit() and (entry / "cgroup").exists() for entry in proc_root.iterdir())
    except OSError:
        live = False
    if not live:
        raise UsageError(f"--proc-root {proc_root}: not a proc tree with live processes (no <pid>/cgroup)")


def check_log_root(log_root: Path) -> None:
    """The kubelet's log root on a node: without its pods/ directory no pod could be named, and a pod on a
    GPU it was not allocated would pass as "not found" rather than as the violation it is."""
    if not (log_root / "pods").is_dir():
        raise UsageError(
            f"--log-root {log_root}: no pods/ directory (the kubelet's pod logs): give the host's /var/log"
        )


def audit(sources: Sources, node_name: str, roles: dict[str, Role]) -> Report:
    """One scan. `roles`: every UUID the stack lists for the node; anything else counts as hidden."""
    check_proc_root(sources.proc_root)
    report = Report(node_name)
    exposed = {uuid for uuid, role in roles.items() if role == Role.EXPOSED}
    kubelet: NodeDevices | None
    try:
        kubelet = read_pod_resources(sources.socket)
    except SocketAbsentError as error:
        kubelet = None
        report.pod_resources = f"absent: {error}; allocations not checked"
        report.warnings.append({"message": f"{error}: allocations not checked (not a node, or a wrong path?)"})
    except UnavailableError as error:
        # What the processes show still counts: a pod on a hidden GPU is a violation without the kubelet.
        kubelet = None
        report.pod_resources = f"failed: {error}; allocations not checked"
        report.failed_sources.append(f"kubelet PodResources: {error}")
    if kubelet is not None:
        check_log_root(sources.log_root)
        _check_allocatable(report, kubelet, roles, exposed)
    seen = Seen(exposed, kubelet, Names.read(sources.log_root))
    with session(sources.nvml):
        if kubelet is not None and kubelet.dra:
            _check_dra(report, kubelet, uuids_by_minor(sources.nvml), exposed)
        for gpu in list_gpus(sources.nvml):
            _check_gpu(report, sources, gpu, seen)
    return report


@dataclass(frozen=True)
class Seen:
    """What one scan knows besides NVML: the stack's exposed UUIDs, the kubelet's view, the names."""

    exposed: set[str]
    kubelet: NodeDevices | None
    names: Names


def _check_allocatable(report: Report, kubelet: NodeDevices, roles: dict[str, Role], exposed: set[str]) -> None:
    for uuid in sorted(kubelet.allocatable):
        if roles.get(uuid) == Role.HIDDEN:
            report.violations.append({"uuid": uuid, "message": "the kubelet can allocate a hidden GPU"})
        elif uuid not in exposed:
            report.violations.append(
                {"uuid": uuid, "message": "the kubelet can allocate a device the stack does not expose"}
            )
    for uuid in sorted(exposed - kubelet.allocatable):
        report.warnings.append({"uuid": uuid, "message": "an exposed GPU is not allocatable (is the plugin running?)"})


def _check_dra(report: Report, kubelet: NodeDevices, by_minor: dict[int, str], exposed: set[str]) -> None:
    """GPUs the kubelet handed containers through DRA claims: each counts as allocated to its pod, and one the
    stack does not expose is a violation (a claim reached it past the guard's classes). A device of NVIDIA's driver
    this audit cannot map to a GPU (a MIG slice, a driver that names them otherwise) is a warning."""
    for found in kubelet.dra:
        if found.driver != NVIDIA_DRA_DRIVER:
            continue
        where = {"claim": found.claim, "device": f"{found.pool}/{found.device}", "holder": str(found.holder)}
        match = DRA_GPU_DEVICE.fullmatch(found.device)
        uuid = by_minor.get(int(match.group(1))) if match else None
        if uuid is None:
            report.warnings.append(
                where
                | {
                    "message": f"DRA device {found.pool}/{found.device} of claim {found.claim}: not mapped to a "
                    "GPU by its minor number, not checked"
                }
            )
            continue
        kubelet.holders.setdefault(uuid, []).append(found.holder)
        if uuid not in exposed:
            report.violations.append(
                where
                | {
                    "uuid": uuid,
                    "message": f"the kubelet gave {found.holder} a hidden GPU through DRA claim {found.claim} "
                    f"(device {found.pool}/{found.device})",
                }
            )


def _check_gpu(report: Report, sources: Sources, gpu: Gpu, seen: Seen) -> None:
    exposed, kubelet, names = seen.exposed, seen.kubelet, seen.names
    # A GPU the stack exposes, whole or by its MIG devices, may be allocated; any other is hidden.
    its_uuids = {gpu.uuid, *(mig.uuid for mig in gpu.mig_devices)}
    is_exposed = bool(its_uuids & exposed)
    entry: dict[str, Any] = {"uuid": gpu.uuid, "index": gpu.index, "exposed": is_exposed, "processes": []}
    report.gpus.append(entry)
    for process in gpu_processes(sources.nvml, gpu.index):
        finding: dict[str, Any] = {"uuid": gpu.uuid, "index": gpu.index, "pid": process.pid}
        try:
            owner = process_owner(sources.proc_root, process.pid)
        except ProcessGoneError:
            report.warnings.append(finding | {"message": "process exited during the scan"})
            continue
        except (OSError, UnicodeDecodeError) as error:
            reason = f"cannot read its cgroup ({getattr(error, 'strerror', None) or type(error).__name__})"
            (report.violations if not is_exposed else report.warnings).append(
                finding | {"message": f"{reason}: owner unknown on a {'exposed' if is_exposed else 'hidden'} GPU"}
            )
            entry["processes"].append({"pid": process.pid, "owner": "unknown"})
            continue
        namespace, pod = names.pods.get(owner.pod_uid or "", (None, None))
        container = names.containers.get(owner.container_id or "")
        entry["processes"].append(
            {
                "pid": process.pid,
                "usedGpuMemoryBytes": process.used_gpu_memory_bytes,
                "podUid": owner.pod_uid,
                "namespace": namespace,
                "pod": pod,
                "container": container,
                "containerId": owner.container_id,
            }
        )
        if owner.pod_uid is None:
            if is_exposed:
                report.warnings.append(finding | {"message": "a process outside Kubernetes uses an exposed GPU"})
            continue
        who = {"podUid": owner.pod_uid, "namespace": namespace, "pod": pod, "container": container}
        if not is_exposed:
            report.violations.append(finding | who | {"message": "a pod uses a hidden GPU"})
        elif kubelet is not None and namespace is None:
            report.warnings.append(
                finding | who | {"message": "pod not found in the kubelet's log directories: allocation not checked"}
            )
        elif kubelet is not None and namespace is not None and pod is not None:
            allocated = kubelet.allocated_to(namespace, pod)
            if not its_uuids & allocated:
                holders = [str(h) for uuid in sorted(its_uuids) for h in kubelet.holders.get(uuid, [])]
                held = f"; the kubelet allocated it to {', '.join(holders)}" if holders else "; allocated to no pod"
                report.violations.append(
                    finding | who | {"message": "a pod uses a GPU the kubelet did not allocate to it" + held}
                )


def _who(finding: dict[str, Any]) -> str:
    if finding.get("pod"):
        container = f" container {finding['container']}" if finding.get("container") else ""
        return f" (pod {finding['namespace']}/{finding['pod']}{container})"
    return f" (pod UID {finding['podUid']})" if finding.get("podUid") else ""


def text(report: Report) -> str:
    lines = [f"node {report.node} (kubelet PodResources: {report.pod_resources})"]
    for gpu in report.gpus:
        role = "exposed" if gpu["exposed"] else "hidden"
        lines.append(f"  GPU {gpu['index']} {gpu['uuid']} ({role}): {len(gpu['processes'])} process(es)")
        for process in gpu["processes"]:
            if process.get("owner") == "unknown":
                where = "owner unknown"
            elif process["pod"]:
                where = f"pod {process['namespace']}/{process['pod']} container {process['container'] or '?'}"
            else:
                where = f"pod UID {process['podUid']}" if process["podUid"] else "host (not in a pod)"
            lines.append(f"    pid {process['pid']}: {where}")
    for label, findings in (("VIOLATION", report.violations), ("warning  ", report.warnings)):
        for finding in findings:
            place = f"GPU {finding['index']} pid {finding['pid']}: " if "pid" in finding else ""
            device = f"{finding['uuid']}: " if "uuid" in finding and "pid" not in finding else ""
            lines.append(f"{label} {place}{device}{finding['message']}{_who(finding)}")
    lines += [f"FAILED    {source}" for source in report.failed_sources]
    failed = f", {len(report.failed_sources)} failed source(s)" if report.failed_sources else ""
    lines.append(f"result: {len(report.violations)} violation(s), {len(report.warnings)} warning(s){failed}")
    return "\n".join(lines)


def main(argv: list[str] | None = None, nvml: ModuleType | None = None) -> int:
    arguments = parser("python -m host.audit", __doc__)
    add_stack_source(arguments)
    arguments.add_argument("--node", default=socket.gethostname(), help="node name (default: this hostname)")
    arguments.add_argument("--proc-root", type=Path, default=Path("/proc"), help="the host's /proc, e.g. /host/proc")
    arguments.add_argument("--log-root", type=Path, default=Path("/var/log"), help="the host's /var/log (kubelet logs)")
    arguments.add_argument(
        "--pod-resources-socket", type=Path, default=POD_RESOURCES_SOCKET, help="the kubelet's socket"
    )
    arguments.add_argument("--json", action="store_true", help="print the report as JSON")
    arguments.add_argument("--watch", action="store_true", help="scan every --interval seconds until stopped")
    arguments.add_argument("--interval", type=positive_seconds, default=60.0, help="seconds between scans with --watch")
    arguments.add_argument(
        "--metrics-port", type=port_number, help="with --watch: serve Prometheus metrics on this port"
    )
    arguments.add_argument("--metrics-address", default="0.0.0.0", help="with --metrics-port: address to listen on")
    arguments.add_argument(
        "--textfile", type=Path, help="with --watch: write metrics for node-exporter's textfile collector"
    )
    arguments.add_argument(
        "--record", type=Path, help="read a recorded host (JSON as discover --json prints) instead of NVML"
    )
    args = arguments.parse_args(argv)

    def command() -> int:
        node = stack_node(stack_file(args), args.node)
        sources = Sources(
            nvml if nvml is not None else load_nvml(args.record),
            args.proc_root,
            args.log_root,
            args.pod_resources_socket,
        )
        if args.watch:
            from host.watch import Watcher  # noqa: PLC0415 - prometheus-client only for --watch

            if args.textfile is not None and not args.textfile.parent.is_dir():
                raise UsageError(f"--textfile {args.textfile}: no directory {args.textfile.parent}; create it first")
            stop = threading.Event()
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: stop.set())
            scan = lambda: audit(sources, node.name, node.roles)  # noqa: E731
            Watcher(scan, args.interval, args.metrics_port, args.textfile, args.metrics_address).run(stop)
            return EXIT_OK
        report = audit(sources, node.name, node.roles)
        print(json.dumps(report.as_json(), indent=2) if args.json else text(report))
        if report.violations:
            return EXIT_FINDING
        return EXIT_UNAVAILABLE if report.failed_sources else EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
