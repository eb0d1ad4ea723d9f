"""Who uses which GPU on this host, and does any Kubernetes pod use a hidden one?

    python -m host.audit --stack-file stacks/Pulumi.prod.yaml --node gpu-node-01 [--proc-root /proc] [--json]

Every process NVML reports is mapped through <proc-root>/<pid>/cgroup to its pod UID and
container id. A pod's process on a hidden GPU is a violation (exit 1); a process outside
Kubernetes on an exposed GPU is a warning (the other organisation may be using one of ours).
"""

from __future__ import annotations

import json
import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from common.cli import EXIT_FINDING, EXIT_OK, parser, run
from host.nvml import gpu_processes, list_gpus, load_nvml, session
from host.stack import stack_node

# The kubelet names pod cgroups `pod<uid>` (cgroupfs driver) or `kubepods-<qos>-pod<uid_with_underscores>.slice`
# (systemd driver); the container's cgroup is its 64-hex id, bare (cgroupfs) or wrapped by the runtime
# (`cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`).
POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)"
)
CONTAINER_ID = re.compile(r"(?:^|/)(?:(?:cri-containerd|crio|docker|containerd)-)?([0-9a-f]{64})(?:\.scope)?$")


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
        return Owner(pod.group(1).replace("_", "-"), container.group(1) if container else None)
    return Owner(None, None)


def process_owner(proc_root: Path, pid: int) -> Owner:
    try:
        return owner_from_cgroup((proc_root / str(pid) / "cgroup").read_text())
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessGoneError from None


@dataclass
class Report:
    node: str
    gpus: list[dict[str, Any]] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node, "gpus": self.gpus, "violations": self.violations, "warnings": self.warnings}


def audit(nvml: ModuleType, node_name: str, exposed_uuids: set[str], proc_root: Path) -> Report:
    report = Report(node_name)
    with session(nvml):
        for gpu in list_gpus(nvml):
            # A GPU the stack does not expose, whole or by its MIG devices, is hidden: the pinned
            # plugin never offers it.
            exposed = gpu.uuid in exposed_uuids or any(mig.uuid in exposed_uuids for mig in gpu.mig_devices)
            entry: dict[str, Any] = {"uuid": gpu.uuid, "index": gpu.index, "exposed": exposed, "processes": []}
            report.gpus.append(entry)
            for process in gpu_processes(nvml, gpu.index):
                finding = {"uuid": gpu.uuid, "index": gpu.index, "pid": process.pid}
                try:
                    owner = process_owner(proc_root, process.pid)
                except ProcessGoneError:
                    report.warnings.append(finding | {"message": "process exited during the scan"})
                    continue
                except OSError as error:
                    owner = Owner(None, None)
                    report.warnings.append(
                        finding | {"message": f"cannot read its cgroup ({error.strerror}): owner unknown; run as root"}
                    )
                entry["processes"].append(
                    {
                        "pid": process.pid,
                        "usedGpuMemoryBytes": process.used_gpu_memory_bytes,
                        "podUid": owner.pod_uid,
                        "containerId": owner.container_id,
                    }
                )
                if owner.pod_uid and not exposed:
                    report.violations.append(
                        finding | {"podUid": owner.pod_uid, "message": "a Kubernetes pod uses a hidden GPU"}
                    )
                elif owner.pod_uid is None and exposed:
                    report.warnings.append(finding | {"message": "a process outside Kubernetes uses an exposed GPU"})
    return report


def text(report: Report) -> str:
    lines = [f"node {report.node}"]
    for gpu in report.gpus:
        role = "exposed" if gpu["exposed"] else "hidden"
        lines.append(f"  GPU {gpu['index']} {gpu['uuid']} ({role}): {len(gpu['processes'])} process(es)")
        for process in gpu["processes"]:
            where = f"pod {process['podUid']}" if process["podUid"] else "host (not in a pod)"
            container = f" container {process['containerId'][:12]}" if process["containerId"] else ""
            lines.append(f"    pid {process['pid']}: {where}{container}")
    lines += [
        f"VIOLATION GPU {v['index']} pid {v['pid']}: {v['message']} (pod {v['podUid']})" for v in report.violations
    ]
    lines += [f"warning   GPU {w['index']} pid {w['pid']}: {w['message']}" for w in report.warnings]
    lines.append(f"result: {len(report.violations)} violation(s), {len(report.warnings)} warning(s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None, nvml: ModuleType | None = None) -> int:
    arguments = parser("python -m host.audit", __doc__)
    arguments.add_argument("--stack-file", type=Path, required=True, help="the stack that lists this node")
    arguments.add_argument("--node", default=socket.gethostname(), help="node name (default: this hostname)")
    arguments.add_argument("--proc-root", type=Path, default=Path("/proc"), help="the host's /proc, e.g. /host/proc")
    arguments.add_argument("--json", action="store_true", help="print the report as JSON")
    args = arguments.parse_args(argv)

    def command() -> int:
        node = stack_node(args.stack_file, args.node)
        module = nvml if nvml is not None else load_nvml()
        report = audit(module, node.name, set(node.exposed_gpus), args.proc_root)
        print(json.dumps(report.as_json(), indent=2) if args.json else text(report))
        return EXIT_FINDING if report.violations else EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
