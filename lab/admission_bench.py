"""What the guard costs every pod create, on a real kube-apiserver (issue 29, 5): a benchmark, not a test.

    python -m lab.admission_bench [--pods 400] [--rounds 3] [--workers 4] [--json-out FILE]

Starts the real tier's control plane (python -m e2e.build first), applies the prod stack's rendered guard and
RuntimeClasses, and creates pods with and without the guard's bindings, in alternating rounds so drift on a
shared machine falls on both sides alike. Two pods: an ordinary tenant pod (one container, one GPU, the node's
RuntimeClass) and the largest the guard judges (LARGE_CONTAINERS containers, about 1 MB). Pods name a
scheduler that does not exist, so nothing schedules them and the scheduler adds no load. Reported per phase:
creates per second seen by the client, client latency p50/p99, and the API server's own figure from /metrics
(deltas over the phase): the ValidatingAdmissionPolicy plugin's admission duration for admitted CREATEs (mean
exact, p50/p99 as the bucket bounds they fall in: the server's buckets are coarse). kube-apiserver v1.36.3 records
the per-policy check histogram (apiserver_validating_admission_policy_check_duration_seconds) only for failed
checks and evaluation errors, never for a passing one (k8s.io/apiserver v0.36.3
plugin/policy/validating/dispatcher.go:226-251), so the plugin's duration, with the guard bound and without, is
where the guard's cost shows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from common.tokens import Token
from e2e.build import LINKS
from e2e.controlplane import ApiError, ControlPlane
from offline import render
from offline.program import run_program
from stack_config.load import read_stack_file
from stack_config.stack_yaml import PREFIX

ROOT = Path(__file__).resolve().parent.parent
STACK_FILE = ROOT / "stacks" / "Pulumi.prod.yaml"
GUARD_KEY = f"{PREFIX}guard"  # the stack file key of GuardConfig
NAMESPACE = "bench"
GUARD_KINDS = (Token.ADMISSION_POLICY, Token.ADMISSION_BINDING)
# The largest pod of the real tier's cost test (tests/real/test_admission.py): well inside etcd's request limit.
LARGE_CONTAINERS = 1000
# The per-plugin admission histogram (label `name` = the plugin).
PLUGIN_METRIC = "apiserver_admission_controller_admission_duration_seconds"


def rendered_guard(**settings: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """The prod stack's guard objects and RuntimeClasses as `make render` writes them, and one class name; with
    guard `settings` (e.g. scope="sharedNodes"), those of prod's stack with them changed."""
    if not settings:
        run = render.render(STACK_FILE).run
    else:  # a map of its own: the harness gives the program a stack file that says what the map says
        config = read_stack_file(STACK_FILE)
        run = run_program({**config, GUARD_KEY: {**config.get(GUARD_KEY, {}), **settings}}, "prod")
    guard = [r.inputs for r in run.kubernetes_objects if r.type in GUARD_KINDS]
    classes = [r.inputs for r in run.kubernetes_objects if r.type == Token.RUNTIME_CLASS]
    return guard, classes, classes[0]["metadata"]["name"]


def tenant_pod(runtime_class: str, containers: int) -> dict[str, Any]:
    def one(index: int) -> dict[str, Any]:
        built: dict[str, Any] = {"name": f"c{index}", "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"}
        if index == 0:
            built["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        else:  # a sidecar that says void, as the guard asks of every container without a request
            built["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, {"name": "PAD", "value": "x" * 900}]
        return built

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "bench-", "namespace": NAMESPACE},
        "spec": {
            "schedulerName": "no-scheduler",
            "runtimeClassName": runtime_class,
            "containers": [one(i) for i in range(containers)],
        },
    }


def scrape(plane: ControlPlane) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the two histograms, keyed by (sample name, labels)."""
    samples = {}
    for family in text_string_to_metric_families(plane.request("GET", "/metrics", raw=True)):
        if family.name == PLUGIN_METRIC:
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def histogram(
    before: dict[Any, float], after: dict[Any, float], metric: str, match: Callable[[dict[str, str]], bool]
) -> dict[str, float | str | None]:
    """Over the samples of `metric` whose labels match: count, mean, and the bucket bounds p50 and p99 fall in."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    for key, value in after.items():
        name, labels = key[0], dict(key[1])
        if not match(labels):
            continue
        delta = value - before.get(key, 0.0)
        if name == f"{metric}_bucket":
            bound = float(labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + delta
        elif name == f"{metric}_sum":
            total += delta
        elif name == f"{metric}_count":
            count += delta

    def bound_of(quantile: float) -> str | None:
        for bound in sorted(buckets):
            if count and buckets[bound] >= quantile * count:
                return f"<= {bound * 1000:g} ms" if bound != float("inf") else "> largest bucket"
        return None

    return {
        "count": count,
        "meanMs": round(total / count * 1000, 3) if count else None,
        "p50": bound_of(0.5),
        "p99": bound_of(0.99),
    }


def _admitted_create(labels: dict[str, str]) -> bool:
    """The ValidatingAdmissionPolicy plugin's admitted CREATEs."""
    wanted = {"name": "ValidatingAdmissionPolicy", "operation": "CREATE", "rejected": "false"}
    return all(labels.get(key) == value for key, value in wanted.items())


def percentile(values: list[float], quantile: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]


def create_many(
    plane: ControlPlane, pod: dict[str, Any], count: int, workers: int, *, dry_run: bool = False
) -> dict[str, float]:
    """`count` creates from `workers` threads: creates per second and client latency percentiles (ms)."""
    path = plane.path(pod, collection=True) + ("?dryRun=All" if dry_run else "")

    def one(_: int) -> float:
        started = time.perf_counter()
        plane.request("POST", path, pod)
        return time.perf_counter() - started

    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        latencies = list(pool.map(one, range(count)))
    elapsed = time.perf_counter() - started
    return {
        "createsPerSecond": round(count / elapsed, 1),
        "p50Ms": round(percentile(latencies, 0.5) * 1000, 2),
        "p99Ms": round(percentile(latencies, 0.99) * 1000, 2),
    }


def set_guard(plane: ControlPlane, guard: list[dict[str, Any]], runtime_class: str, *, bound: bool) -> None:
    """Apply the guard's policies; apply or delete its bindings; wait until the API server acts on that."""
    for obj in guard:
        if obj["kind"] == "ValidatingAdmissionPolicy" or bound:
            plane.apply(obj)
        else:
            try:
                plane.request("DELETE", plane.path(obj))
            except ApiError as error:
                if error.code != 404:
                    raise
    deadline = time.monotonic() + 30
    while True:  # the admission plugin sees bindings through an informer: wait for the change to take
        if guard_denies(plane, runtime_class) == bound:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the guard did not become {'bound' if bound else 'unbound'} in 30 s")
        time.sleep(0.2)


def guard_denies(plane: ControlPlane, runtime_class: str) -> bool:
    """Whether the guard denies, now, a dry-run pod that asks for every GPU through its env."""
    probe = tenant_pod(runtime_class, 1)
    probe["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    return denied(plane, probe)


def denied(plane: ControlPlane, probe: dict[str, Any]) -> bool:
    """Whether the guard denies the pod, now, in a dry-run create."""
    try:
        plane.create(probe, dry_run=True)
    except ApiError as error:
        return "hidden-gpu guard" in error.message
    return False


@contextmanager
def bench_plane(minor: str = "") -> Iterator[ControlPlane]:
    """The tier's control plane, or another minor's API server beside etcd alone (tests/real/test_admission_minors.py),
    where the bench makes the namespace's ServiceAccount as the controller manager would."""
    with ControlPlane.start(LINKS, minor=minor) as plane:
        plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        if minor:
            account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
            plane.apply({**account, "metadata": {"name": "default", "namespace": NAMESPACE}})
        deadline = time.monotonic() + 30
        while True:  # ServiceAccount admission refuses pods until the controller has made `default`
            try:
                plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
                break
            except ApiError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield plane


def measure(pods: int, rounds: int, workers: int, minor: str = "") -> dict[str, Any]:
    guard, classes, runtime_class = rendered_guard()
    results: dict[str, Any] = {"pods": pods, "rounds": rounds, "workers": workers, "phases": []}
    with bench_plane(minor) as plane:
        version = plane.request("GET", "/version")
        results["kubeApiserver"] = version.get("gitVersion")
        for runtime in classes:
            plane.apply(runtime)
        shapes = {
            "ordinary": (tenant_pod(runtime_class, 1), pods),
            "largest": (tenant_pod(runtime_class, LARGE_CONTAINERS), max(1, pods // 40)),
        }
        results["largestPodBytes"] = len(json.dumps(shapes["largest"][0]))
        for round_ in range(rounds):
            for bound in (False, True) if round_ % 2 == 0 else (True, False):
                set_guard(plane, guard, runtime_class, bound=bound)
                for shape, (pod, count) in shapes.items():
                    before = scrape(plane)
                    client = create_many(plane, pod, count, workers)
                    after = scrape(plane)
                    results["phases"].append(
                        {
                            "round": round_,
                            "guard": bound,
                            "pod": shape,
                            "client": client,
                            "vapPlugin": histogram(before, after, PLUGIN_METRIC, _admitted_create),
                            # Still bound (or still unbound) when the phase ended: what was measured is that.
                            "guardHeld": guard_denies(plane, runtime_class),
                        }
                    )
    results["summary"] = summarise(results["phases"])
    return results


def summarise(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Per pod shape: medians over rounds with and without the guard, and the throughput cost in percent."""
    summary: dict[str, Any] = {}
    for shape in sorted({p["pod"] for p in phases}):
        side = {bound: [p for p in phases if p["pod"] == shape and p["guard"] == bound] for bound in (False, True)}
        median = {
            bound: {
                key: statistics.median(p["client"][key] for p in side[bound])
                for key in ("createsPerSecond", "p50Ms", "p99Ms")
            }
            for bound in (False, True)
        }
        costs = [
            1 - with_["client"]["createsPerSecond"] / without["client"]["createsPerSecond"]
            for with_, without in zip(side[True], side[False], strict=True)
        ]
        summary[shape] = {
            "withoutGuard": median[False],
            "withGuard": median[True],
            "throughputCostPercent": round(statistics.median(costs) * 100, 1),
            "vapPluginMeanMs": {
                ("withGuard" if bound else "withoutGuard"): statistics.median(
                    p["vapPlugin"]["meanMs"] for p in side[bound]
                )
                for bound in (False, True)
            },
            "vapPluginP99": {
                ("withGuard" if bound else "withoutGuard"): sorted({p["vapPlugin"]["p99"] for p in side[bound]})
                for bound in (False, True)
            },
        }
    return summary


def built(prog: str, minor: str) -> bool:
    """Whether the minor's API server (or the k8s group's) is linked; says how to get it where not."""
    server = f"kube-apiserver-{minor}" if minor else "kube-apiserver"
    if not (LINKS / server).exists():
        print(f"{prog}: no {server} in {LINKS}: run python -m e2e.build first", file=sys.stderr)
    return (LINKS / server).exists()


def main(argv: list[str] | None = None) -> int:
    arguments = argparse.ArgumentParser(prog="python -m lab.admission_bench", description=__doc__.split("\n\n")[0])
    arguments.add_argument("--pods", type=int, default=400, help="ordinary pods per phase (the largest: a 40th)")
    arguments.add_argument("--rounds", type=int, default=3, help="rounds, each with and without the guard")
    arguments.add_argument("--workers", type=int, default=4, help="concurrent clients")
    arguments.add_argument("--json-out", type=Path, help="also write the full results here")
    arguments.add_argument("--minor", default="", help="another minor's API server (1.35, 1.36, 1.38), etcd beside it")
    args = arguments.parse_args(argv)
    if not built("lab.admission_bench", args.minor):
        return 2
    return said(measure(args.pods, args.rounds, args.workers, args.minor), args.json_out, indent=2)


def said(results: dict[str, Any], json_out: Path | None, *, indent: int) -> int:
    """The summary printed, the whole record written where asked."""
    if json_out:
        json_out.write_text(json.dumps(results, indent=indent) + "\n")
    print(json.dumps(results["summary"], indent=indent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
