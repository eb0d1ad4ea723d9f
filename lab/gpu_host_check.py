"""Prove the host tools on a real NVIDIA GPU host; prints what the README's host-tools section reports.

    python3 -m lab.gpu_host_check [--runs 15] [--json-out NEW_FILE]

1. `host.discover --json` against `nvidia-smi --query-gpu=...`, field by field.
2. Wall time (median of --runs) of `discover --json`, `nvidia-smi -L`, and a bare `python3 -c`
   that only initialises NVML and reads the same fields: discover should add at most 50 ms.
3. `host.audit` seeing a real CUDA process (PyTorch) on GPU 0, with GPU 0 hidden, then exposed,
   then hidden with the process's cgroup shown as a pod's (a fixture /proc): a violation.
Needs a GPU, nvidia-smi, nvidia-ml-py; PyTorch for the CUDA process; PyYAML and pydantic for audit; the
repository (it plays the kubelet with tests/support/fake_kubelet.py). A proof, not a host tool: it lives
with the real tier. Without nvidia-smi or a GPU it says so in one line (exit 3).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common.cli import EXIT_FINDING, EXIT_OK, UnavailableError, UsageError, bounded, parser, run

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
BARE_NVML = (
    "import pynvml as n\n"
    "n.nvmlInit()\n"
    "for i in range(n.nvmlDeviceGetCount()):\n"
    "    h = n.nvmlDeviceGetHandleByIndex(i)\n"
    "    n.nvmlDeviceGetUUID(h); n.nvmlDeviceGetName(h); n.nvmlDeviceGetPciInfo(h).busId\n"
    "    n.nvmlDeviceGetMemoryInfo(h).total\n"
    "n.nvmlShutdown()\n"
)
HOLD_GPU = (
    "import torch, time\n"
    "x = torch.ones(1 << 20, device='cuda:0')\n"
    "torch.cuda.synchronize()\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)
# What every stack names outside hidden-gpu: (a cluster, no default provider); none is used here.
CLUSTER = "  kubernetes:context: gpu-host-check\n  pulumi:disable-default-providers: [kubernetes]\n"
POD_UID = "0d3d1c8a-6b0e-4c3c-9a4c-1e2f3a4b5c6d"
CONTAINER_ID = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=check)


def compare_with_nvidia_smi() -> dict[str, Any]:
    ours = json.loads(sh(PY, "-m", "host.discover", "--json").stdout)
    query = "index,uuid,name,pci.bus_id,memory.total"
    rows = sh("nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits").stdout.strip().splitlines()
    mismatches = []
    for gpu, row in zip(ours, rows, strict=True):
        index, uuid, name, bus_id, memory_mib = (cell.strip() for cell in row.split(","))
        pairs = {
            "index": (gpu["index"], int(index)),
            "uuid": (gpu["uuid"], uuid),
            "name": (gpu["name"], name),
            "pciBusId": (gpu["pciBusId"], bus_id),
            "memoryTotal MiB": (gpu["memoryTotalBytes"] // 2**20, int(memory_mib)),
        }
        mismatches += [
            f"GPU {index} {field}: ours {a!r}, nvidia-smi {b!r}" for field, (a, b) in pairs.items() if a != b
        ]
    listed = sh("nvidia-smi", "-L").stdout
    mismatches += [f"{gpu['uuid']} not in nvidia-smi -L" for gpu in ours if gpu["uuid"] not in listed]
    return {"gpus": ours, "nvidiaSmi": rows, "mismatches": mismatches}


def median_ms(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, cwd=ROOT, capture_output=True, check=True)
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 1)


def timings(runs: int) -> dict[str, float]:
    result = {
        "discover --json": median_ms([PY, "-m", "host.discover", "--json"], runs),
        "nvidia-smi -L": median_ms(["nvidia-smi", "-L"], runs),
        "bare python3 NVML": median_ms([PY, "-c", BARE_NVML], runs),
    }
    result["discover minus bare"] = round(result["discover --json"] - result["bare python3 NVML"], 1)
    return result


def run_audit(stack: Path, node: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return sh(PY, "-m", "host.audit", "--stack-file", str(stack), "--node", node, *extra, check=False)


def stack_from_discover(path: Path, exposed_indices: str, node: str) -> Path:
    """A stack file whose one node is the entry `discover --expose` writes for this host."""
    entry = sh(PY, "-m", "host.discover", "--expose", exposed_indices, "--node", node).stdout
    indented = "\n".join("    " + line for line in entry.splitlines())
    path.write_text(f"config:\n{CLUSTER}  hidden-gpu:nodes:\n{indented}\n")
    return path


def audit_real_process(workdir: Path) -> dict[str, Any]:
    holder = subprocess.Popen([PY, "-c", HOLD_GPU], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        time.sleep(1)
        smi_pids = sh("nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader").stdout
        uuids = [g["uuid"] for g in json.loads(sh(PY, "-m", "host.discover", "--json").stdout)]
        results: dict[str, Any] = {"holderPid": holder.pid, "nvidiaSmiComputeApps": smi_pids.strip()}
        node = "gpu-host-check"
        for label, exposed_indices, proc_root in (
            ("gpu0-hidden", "", "/proc"),
            ("gpu0-exposed", "0", "/proc"),
            ("gpu0-hidden-process-in-a-pod", "", str(fake_pod_proc(workdir, holder.pid))),
        ):
            stack = stack_from_discover(workdir / f"Pulumi.{label}.yaml", exposed_indices, node)
            check = sh(PY, "-m", "host.discover", "--check", "--stack-file", str(stack), "--node", node, check=False)
            audit = run_audit(stack, node, "--proc-root", proc_root, "--json")
            report: dict[str, Any] = json.loads(audit.stdout) if audit.stdout else {"stderr": audit.stderr}
            results[label] = {
                "checkExit": check.returncode,
                "auditExit": audit.returncode,
                "gpu0": next((g for g in report.get("gpus", []) if g["uuid"] == uuids[0]), None),
                "violations": report.get("violations"),
                "warnings": report.get("warnings"),
                "stderr": audit.stderr.strip(),
            }
        results["real-pod-cgroup"] = audit_in_a_real_pod_cgroup(workdir, holder.pid, uuids[0])
        return results
    finally:
        holder.kill()
        holder.wait()


def audit_in_a_real_pod_cgroup(workdir: Path, pid: int, gpu0: str) -> dict[str, Any]:
    """The real CUDA process moved into a pod-shaped cgroup v2 (as the kubelet's systemd driver names
    it), the kubelet's log layout beside it, and a PodResources server on a real unix socket (the
    tests' fake kubelet: there is none here): GPU 0 exposed and allocated to the process's own pod,
    then to another pod. The audit reads the real /proc."""
    from tests.support.fake_kubelet import Kubelet, serve  # noqa: PLC0415 - only on the GPU host check

    cgroup_root = Path("/sys/fs/cgroup")
    pod = POD_UID.replace("-", "_")
    scope = cgroup_root / "kubepods.slice" / f"kubepods-pod{pod}.slice" / f"cri-containerd-{CONTAINER_ID}.scope"
    try:
        scope.mkdir(parents=True)
        (scope / "cgroup.procs").write_text(str(pid))
    except OSError as error:
        return {"skipped": f"cgroup v2 not writable here: {error}"}
    logs = workdir / "log"
    (logs / "pods" / f"ml-team_trainer_{POD_UID}").mkdir(parents=True)
    (logs / "containers").mkdir(parents=True)
    (logs / "containers" / f"trainer_ml-team_main-{CONTAINER_ID}.log").write_text("")
    stack = stack_from_discover(workdir / "Pulumi.real-pod.yaml", "0", "gpu-host-check")
    results: dict[str, Any] = {"cgroup": (Path("/proc") / str(pid) / "cgroup").read_text().strip()}
    try:
        for label, holder_pod in (("allocated-to-its-pod", "trainer"), ("allocated-to-another-pod", "notebook")):
            kubelet = Kubelet(
                allocatable={"nvidia.com/gpu": [gpu0]},
                pods={("ml-team", holder_pod): {"main": {"nvidia.com/gpu": [gpu0]}}},
            )
            with serve(workdir / "kubelet.sock", kubelet):
                audit = run_audit(
                    stack,
                    "gpu-host-check",
                    "--log-root",
                    str(logs),
                    "--pod-resources-socket",
                    str(workdir / "kubelet.sock"),
                )
            results[label] = {
                "auditExit": audit.returncode,
                "report": audit.stdout.strip().splitlines(),
                "calls": kubelet.calls,
            }
    finally:
        (cgroup_root / "cgroup.procs").write_text(str(pid))
        for path in (scope, scope.parent, scope.parent.parent):
            with contextlib.suppress(OSError):
                path.rmdir()
    return results


def fake_pod_proc(workdir: Path, pid: int) -> Path:
    """A /proc where the real CUDA process's cgroup reads as a Kubernetes pod's (cgroup v2, systemd)."""
    root = workdir / "proc"
    (root / "self").mkdir(parents=True, exist_ok=True)  # what makes it a proc tree to the audit
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    pod = POD_UID.replace("-", "_")
    (root / str(pid) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{pod}.slice/cri-containerd-{CONTAINER_ID}.scope\n"
    )
    return root


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python3 -m lab.gpu_host_check", __doc__)
    arguments.add_argument("--runs", type=int, default=15, help="timed runs per command (the median is kept)")
    arguments.add_argument("--json-out", type=Path, help="also write the report to this new file")
    args = arguments.parse_args(argv)

    def command() -> int:
        if args.json_out and args.json_out.exists():
            raise UsageError(f"--json-out {args.json_out}: exists; measurements are never overwritten")
        if shutil.which("nvidia-smi") is None:
            raise UnavailableError("no nvidia-smi here: run this on a GPU host (docs/testing.md)")
        workdir = Path(tempfile.mkdtemp(prefix="gpu-host-check-"))
        try:
            report: dict[str, Any] = {
                "python": sys.version.split()[0],
                "nvidiaSmi": sh(
                    "nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"
                ).stdout.strip(),
                "comparison": compare_with_nvidia_smi(),
                "timingsMs": timings(args.runs),
                "audit": audit_real_process(workdir) if os.environ.get("SKIP_AUDIT") != "1" else None,
            }
        except subprocess.CalledProcessError as error:
            raise UnavailableError(
                f"{' '.join(map(str, error.cmd))[:80]} failed ({error.returncode}): {bounded(error.stderr or '')}"
            ) from None
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        text = json.dumps(report, indent=2)
        print(text)
        if args.json_out:
            # A new file only: a measurement never overwrites an earlier one.
            with args.json_out.open("x", encoding="utf-8") as out:
                out.write(text)
        return EXIT_FINDING if report["comparison"]["mismatches"] else EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
