"""How the program's cost grows with the fleet, next to plain pulumi-kubernetes.

    python -m offline.bench --nodes 1,10,100,1000 [--json]

For each size, a synthetic stack of that many 8-GPU nodes (2 exposed, 6 hidden) runs through
the real program under Pulumi's mocks; the baseline declares the very same Kubernetes objects
directly with pulumi-kubernetes (no validation, no components), also under Pulumi's mocks. Each
measurement runs in a fresh interpreter pinned to one CPU, warmed up and timed after imports; peak
memory is that process's maximum resident set. scripts/bench_instructions.sh counts instructions instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from common.cli import EXIT_OK, UsageError, parser, run
from common.names import PROJECT
from common.tokens import Token
from desired.stack_claims import exposed_by_node, record_data
from offline.program import run_callable, run_program
from stack_config import parse_project_config

ROOT = Path(__file__).resolve().parent.parent
GPUS_PER_NODE = 8
EXPOSED_PER_NODE = 2


def synthetic_stack(nodes: int) -> dict[str, Any]:
    def gpu(node: int, index: int) -> str:
        return f"GPU-{uuid.UUID(int=node * GPUS_PER_NODE + index + 1, version=4)}"

    return {
        "kubernetes:context": "bench",
        "pulumi:disable-default-providers": ["kubernetes"],
        f"{PROJECT}:nodes": [
            {
                "name": f"gpu-node-{node:05d}",
                "exposedGpus": [gpu(node, i) for i in range(EXPOSED_PER_NODE)],
                "hiddenGpus": [gpu(node, i) for i in range(EXPOSED_PER_NODE, GPUS_PER_NODE)],
            }
            for node in range(nodes)
        ],
        f"{PROJECT}:quotas": {"ml-team": EXPOSED_PER_NODE},
    }


def _resource_class(type_token: str) -> Any:
    """kubernetes:apps/v1:DaemonSet -> pulumi_kubernetes.apps.v1.DaemonSet"""
    _, module_path, name = type_token.split(":")
    group, version = module_path.split("/")
    return getattr(importlib.import_module(f"pulumi_kubernetes.{group.split('.')[0]}.{version}"), name)


def _substituter(replacements: dict[str, str]) -> Callable[[str], str]:
    pattern = re.compile("|".join(map(re.escape, replacements)))
    return lambda text: pattern.sub(lambda match: replacements[match.group(0)], text)


def baseline_objects(nodes: int) -> list[tuple[str, str, dict[str, Any]]]:
    """The objects the program declares for `nodes` nodes, as (type, name, object), built by
    substituting each node's name and UUIDs into what the program renders for one node."""
    template = run_program(synthetic_stack(1), "bench").kubernetes_objects
    one_node = synthetic_stack(1)[f"{PROJECT}:nodes"][0]
    # The stack's record lists every node: written whole, not once per node.
    records = [r for r in template if Token.STACK_RECORD in r.parent]
    per_node = [r for r in template if r not in records and one_node["name"] in json.dumps(r.inputs)]
    shared = [(r.type, r.name, r.inputs) for r in template if r not in per_node and r not in records]
    listed = record_data("bench", exposed_by_node(parse_project_config(synthetic_stack(nodes)).nodes))
    objects = shared + [(r.type, r.name, r.inputs | {"data": listed}) for r in records]
    for node in synthetic_stack(nodes)[f"{PROJECT}:nodes"]:
        replacements = {one_node["name"]: node["name"]}
        for key in ("exposedGpus", "hiddenGpus"):
            replacements |= dict(zip(one_node[key], node[key], strict=True))
        substitute = _substituter(replacements)
        objects += [(r.type, substitute(r.name), json.loads(substitute(json.dumps(r.inputs)))) for r in per_node]
    return objects


def run_baseline(objects: list[tuple[str, str, dict[str, Any]]]) -> None:
    def declare() -> None:
        provider = pulumi.ResourceOptions(provider=k8s.Provider("kubernetes"))
        for type_token, name, obj in objects:
            args = {key: value for key, value in obj.items() if key not in ("apiVersion", "kind")}
            _resource_class(type_token)(name, **args, opts=provider)

    run_callable(declare, "bench")


def pin_to_one_cpu() -> None:
    """Keep this process's threads on one CPU, as pyperf's --affinity does. Only one Python thread
    runs at a time (the GIL), but the mock engine answers on executor threads, and a scheduler
    that moves each hand-off to the other core adds cache traffic that varies from run to run and
    weighs more on the side with more registrations per node (README, "Fleet size")."""
    if hasattr(os, "sched_setaffinity"):  # Linux; elsewhere runs stay unpinned
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})


def _worker(kind: str, nodes: int, *, callgrind: bool = False) -> dict[str, Any]:
    if not callgrind:  # counted instructions do not depend on the core; bench_instructions.sh runs two at once
        pin_to_one_cpu()
    # Both sides start warm: every module imported and the runtime exercised once.
    run_program(synthetic_stack(1), "warm-up")
    if kind == "program":
        config = synthetic_stack(nodes)
        seconds = _timed(lambda: run_program(config, "bench"), callgrind)
    else:
        objects = baseline_objects(nodes)
        seconds = _timed(lambda: run_baseline(objects), callgrind)
    return {"seconds": seconds, "peakMemoryBytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _timed(action: Callable[[], object], callgrind: bool) -> float:
    """Seconds `action` takes; under `valgrind --tool=callgrind --instr-atstart=no`, also the only
    part whose instructions are counted (scripts/bench_instructions.sh): a count that the
    machine's drift does not move."""
    if callgrind:
        _callgrind_instrumentation("on")
    start = time.perf_counter()
    try:
        action()
    finally:
        seconds = time.perf_counter() - start
        if callgrind:
            _callgrind_instrumentation("off")
    return seconds


def _callgrind_instrumentation(state: str) -> None:
    subprocess.run(["callgrind_control", "--instr", state, str(os.getpid())], check=True, capture_output=True)


def measure(kind: str, nodes: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "offline.bench", "--worker", kind, "--nodes", str(nodes)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    measured: dict[str, Any] = json.loads(result.stdout)
    return measured


def rows(sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    """Medians of `repeat` runs of each side. A shared 2-core machine drifts by 20% from minute to
    minute, so the two sides run back to back, in turns first, and the ratio is the median of
    each pair's ratio rather than a ratio of medians taken minutes apart."""
    table = []
    for nodes in sizes:
        pairs = []
        for turn in range(repeat):
            if turn % 2:
                baseline, program = measure("baseline", nodes), measure("program", nodes)
            else:
                program, baseline = measure("program", nodes), measure("baseline", nodes)
            pairs.append((program, baseline))
        table.append(
            {
                "nodes": nodes,
                "programSeconds": round(statistics.median(p["seconds"] for p, _ in pairs), 3),
                "baselineSeconds": round(statistics.median(b["seconds"] for _, b in pairs), 3),
                "ratio": round(statistics.median(p["seconds"] / b["seconds"] for p, b in pairs), 2),
                "peakMemoryBytes": max(p["peakMemoryBytes"] for p, _ in pairs),
            }
        )
    return table


def text(table: list[dict[str, Any]]) -> str:
    lines = [f"{'nodes':>6}  {'program s':>10}  {'baseline s':>10}  {'ratio':>5}  {'ms/node':>8}  {'peak MiB':>8}"]
    for row in table:
        per_node = 1000 * row["programSeconds"] / row["nodes"]
        lines.append(
            f"{row['nodes']:>6}  {row['programSeconds']:>10.2f}  {row['baselineSeconds']:>10.2f}  "
            f"{row['ratio']:>5.2f}  {per_node:>8.1f}  {row['peakMemoryBytes'] / 2**20:>8.0f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python -m offline.bench", __doc__)
    arguments.add_argument("--nodes", default="1,10,100,1000", help="comma-separated stack sizes")
    arguments.add_argument("--json", action="store_true", help="print the rows as JSON")
    arguments.add_argument("--repeat", type=int, default=5, help="program/baseline pairs per size")
    arguments.add_argument("--worker", choices=["program", "baseline"], help=argparse.SUPPRESS)
    arguments.add_argument("--callgrind", action="store_true", help=argparse.SUPPRESS)
    args = arguments.parse_args(argv)

    def command() -> int:
        try:
            sizes = [int(n) for n in args.nodes.split(",")]
        except ValueError:
            raise UsageError(f"--nodes {args.nodes}: expected whole numbers, e.g. 1,10,100") from None
        if any(n < 1 for n in sizes):
            raise UsageError(f"--nodes {args.nodes}: sizes must be at least 1")
        if args.worker:
            print(json.dumps(_worker(args.worker, sizes[0], callgrind=args.callgrind)))
            return EXIT_OK
        table = rows(sizes, max(1, args.repeat))
        print(json.dumps(table, indent=2) if args.json else text(table))
        return EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
