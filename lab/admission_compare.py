"""What the guard costs a pod create next to what the API server already does (issue 43, 1): a benchmark, not a
test.

    python -m lab.admission_compare [--creates 240] [--rounds 3] [--workers 2] [--minor 1.36] [--json-out FILE]

One real kube-apiserver (python -m e2e.build first), eight configurations side by side, each a namespace of its own
so that switching costs nothing: `none`; Pod Security `baseline` and `restricted` (the namespace's enforce label);
the `floor`, a ValidatingAdmissionPolicy with one `true` validation and no match condition (the least any policy
costs); the `guard` (prod's rendered policies, their bindings narrowed to the namespaces labelled for it);
`guard+restricted`; `per-rule`, the guard's pod policy without its fast path (one scan per rule, as before
issue 43), so what that rewrite buys is measured in the same run; and `scoped`, the pod policy as prod renders it
with `guard.scope: sharedNodes`, on a pod outside that scope. The same pod, admitted by every configuration, at 1,
4, 16, 64 and 256 containers: the first asks for a GPU under the node's RuntimeClass, the others say void, every
one as `restricted` asks; `scoped`'s pod is the same without the GPU and the RuntimeClass.

Creates are dry runs (`?dryRun=All`): admission runs whole and etcd is not written, so admission is what is
measured. Rounds visit the configurations in turn, in the opposite order every other round, so drift on a
shared machine falls on all alike. Per phase: the plugins' own mean for admitted CREATEs from the server's
`apiserver_admission_controller_admission_duration_seconds` (ValidatingAdmissionPolicy and PodSecurity, deltas
of sum/count), client p50/p99 per request, creates per second and the API server's CPU per create (/proc). Of the
guard's three policies only hidden-gpu-access-guard matches pods, so the guard's share is all its; the server's
per-policy histogram (`apiserver_validating_admission_policy_check_duration_seconds`) has no admitted request on
v1.37.2 (it records denials), so it cannot split a policy's cost further.
The summary has the medians over rounds, each configuration's cost (its policies' plugin mean), the ratios the
issue sets goals for, and the guard's growth per container (least squares over the sizes).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from common.names import POLICY_NAME
from desired.pod_checks import FAST_PATH
from e2e.controlplane import ControlPlane
from lab.admission_bench import bench_plane, built, create_many, denied, rendered_guard, said

SIZES = (1, 4, 16, 64, 256)
PSA_LABEL = "pod-security.kubernetes.io/enforce"
ON_LABEL = "hidden-gpu.bench/{}"  # which VAP configuration a namespace is for
CONFIGS: dict[str, dict[str, str]] = {
    "none": {},
    "baseline": {PSA_LABEL: "baseline"},
    "restricted": {PSA_LABEL: "restricted"},
    "floor": {ON_LABEL.format("floor"): "on"},
    "guard": {ON_LABEL.format("guard"): "on"},
    "guard+restricted": {ON_LABEL.format("guard"): "on", PSA_LABEL: "restricted"},
    "per-rule": {ON_LABEL.format("per-rule"): "on"},
    "scoped": {ON_LABEL.format("scoped"): "on"},
}
# The `scoped` configuration's pod is one its scope leaves alone: the same containers, no GPU, no RuntimeClass, no
# toleration of the shared-node taint (a CPU pod anywhere in the cluster).
OUTSIDE_SCOPE = ("scoped",)
PLUGINS = {"vap": "ValidatingAdmissionPolicy", "podSecurity": "PodSecurity"}
ADMISSION = "apiserver_admission_controller_admission_duration_seconds"
FLOOR = "hidden-gpu-bench-floor"
# The goals of issue 43, 3: at 1 and 64 containers, the guard's plugin mean over the floor's and over restricted's.
GOALS = {1: {"floor": 2.0, "restricted": 6.0}, 64: {"floor": 5.0, "restricted": 15.0}}
GOAL_PER_CONTAINER_US = 10.0
TICKS = os.sysconf("SC_CLK_TCK")


def namespace(config: str) -> str:
    return "cmp-" + config.replace("+", "-")


def restricted_container(name: str, gpu: bool) -> dict[str, Any]:
    built: dict[str, Any] = {
        "name": name,
        "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if gpu:
        built["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    else:
        built["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    return built


def the_pod(runtime_class: str, containers: int, config: str) -> dict[str, Any]:
    inside = config not in OUTSIDE_SCOPE
    built = [restricted_container(f"c{i}", inside and i == 0) for i in range(containers)]
    return pod_of(built, runtime_class if inside else "", config)


def pod_of(containers: list[dict[str, Any]], runtime_class: str, config: str) -> dict[str, Any]:
    """A pod of these containers in the configuration's namespace (under the RuntimeClass, if one is named), which
    no scheduler will place."""
    runtime = {"runtimeClassName": runtime_class} if runtime_class else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bench", "namespace": namespace(config)},
        "spec": {"schedulerName": "no-scheduler", **runtime, "containers": containers},
    }


def floor_policy() -> list[dict[str, Any]]:
    api = "admissionregistration.k8s.io/v1"
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
    return [
        {
            "apiVersion": api,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": FLOOR},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": rules},
                "validations": [{"expression": "true"}],
            },
        },
        {
            "apiVersion": api,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": FLOOR},
            "spec": {
                "policyName": FLOOR,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": CONFIGS["floor"]}},
            },
        },
    ]


def narrowed(guard: list[dict[str, Any]], config: str = "guard") -> list[dict[str, Any]]:
    """The guard as rendered, its bindings also requiring the configuration's namespace label."""
    out = copy.deepcopy(guard)
    for obj in out:
        if obj["kind"] == "ValidatingAdmissionPolicyBinding":
            selector = obj["spec"].setdefault("matchResources", {}).setdefault("namespaceSelector", {})
            ((key, value),) = CONFIGS[config].items()
            selector.setdefault("matchExpressions", []).append({"key": key, "operator": "In", "values": [value]})
    return out


def pod_policy_as(guard: list[dict[str, Any]], config: str) -> list[dict[str, Any]]:
    """The guard's pod policy and its bindings under names of their own, bound to the configuration's namespace."""
    out = []
    for obj in narrowed([o for o in guard if o["metadata"]["name"] == POLICY_NAME], config):
        obj["metadata"]["name"] = f"{POLICY_NAME}-{config}"
        if obj["kind"] != "ValidatingAdmissionPolicy":
            obj["spec"]["policyName"] = obj["metadata"]["name"]
        out.append(obj)
    return out


def per_rule(guard: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pod policy without its fast path (each rule scans the containers itself, as before issue 43): the
    rewrite's A/B within one run."""
    prefix = f"variables.{FAST_PATH} || "
    out = pod_policy_as(guard, "per-rule")
    for obj in out:
        if obj["kind"] == "ValidatingAdmissionPolicy":
            spec = obj["spec"]
            spec["variables"] = [v for v in spec["variables"] if v["name"] != FAST_PATH]
            for rule in spec["validations"]:
                rule["expression"] = rule["expression"].replace(prefix, "")
    return out


def scrape(plane: ControlPlane) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(plane.request("GET", "/metrics", raw=True)):
        if family.name == ADMISSION:
            for sample in family.samples:
                if sample.name.endswith(("_sum", "_count")):
                    samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def mean_ms(before: dict[Any, float], after: dict[Any, float], metric: str, **wanted: str) -> tuple[float, float]:
    """(count, mean ms) over the samples of `metric` whose labels hold `wanted`."""
    total = count = 0.0
    for key, value in after.items():
        labels = dict(key[1])
        if all(labels.get(k) == v for k, v in wanted.items()):
            if key[0] == f"{metric}_sum":
                total += value - before.get(key, 0.0)
            elif key[0] == f"{metric}_count":
                count += value - before.get(key, 0.0)
    return count, (round(total / count * 1000, 4) if count else 0.0)


def cpu_seconds(plane: ControlPlane) -> float:
    (process,) = [p for name, p in plane.processes.running.items() if name.startswith("kube-apiserver")]
    fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def creates_for(containers: int, creates: int) -> int:
    return max(30, round(creates * 4 / max(4, containers)))


def phase(plane: ControlPlane, pod: dict[str, Any], count: int, workers: int) -> dict[str, Any]:
    plane.create(pod, dry_run=True)  # admitted, or the configuration is not what it says
    before, cpu = scrape(plane), cpu_seconds(plane)
    client = create_many(plane, pod, count, workers, dry_run=True)
    cpu, after = cpu_seconds(plane) - cpu, scrape(plane)
    plugins = {}
    for key, name in PLUGINS.items():
        seen, ms = mean_ms(before, after, ADMISSION, name=name, operation="CREATE", rejected="false")
        plugins[key] = {"count": seen, "meanMs": ms}
    return {"client": client, "plugins": plugins, "cpuMsPerCreate": round(cpu / count * 1000, 3)}


def prepare(plane: ControlPlane) -> str:
    guard, classes, runtime_class = rendered_guard()
    scoped = pod_policy_as(rendered_guard(scope="sharedNodes")[0], "scoped")
    for obj in [*classes, *narrowed(guard), *per_rule(guard), *scoped, *floor_policy()]:
        plane.apply(obj)
    for config, labels in CONFIGS.items():
        plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace(config), "labels": labels}})
        account = {"apiVersion": "v1", "kind": "ServiceAccount"}
        plane.apply({**account, "metadata": {"name": "default", "namespace": namespace(config)}})
    for config in ("guard", "per-rule", "scoped"):
        # A pod each configuration denies (in the scope: the node's RuntimeClass), so its bindings are seen to take.
        probe = pod_of([restricted_container("c0", False)], runtime_class, config)
        probe["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        deadline = time.monotonic() + 30
        while not denied(plane, probe):  # the plugin sees bindings through an informer: wait until they take
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {config} configuration's bindings did not take in 30 s")
            time.sleep(0.2)
    return runtime_class


@contextmanager
def compare_plane(minor: str = "") -> Iterator[tuple[ControlPlane, str]]:
    """The API server with every configuration in place, and the RuntimeClass the pods name."""
    with bench_plane(minor) as plane:
        yield plane, prepare(plane)


def measure(creates: int, rounds: int, workers: int, minor: str = "", sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    results: dict[str, Any] = {"creates": creates, "rounds": rounds, "workers": workers, "phases": []}
    with compare_plane(minor) as (plane, runtime_class):
        results["kubeApiserver"] = plane.request("GET", "/version").get("gitVersion")
        for round_ in range(rounds):
            order = list(CONFIGS) if round_ % 2 == 0 else list(reversed(CONFIGS))
            for containers in sizes:
                count = creates_for(containers, creates)
                for config in order:
                    measured = phase(plane, the_pod(runtime_class, containers, config), count, workers)
                    results["phases"].append({"round": round_, "containers": containers, "config": config,
                                              "creates": count, **measured})  # fmt: skip
    results["summary"] = summarise(results["phases"])
    return results


def cost(config: str, plugins: dict[str, float]) -> float:
    """What a configuration's own policies cost a create: the plugin that runs them."""
    return {"none": 0.0, "baseline": plugins["podSecurity"], "restricted": plugins["podSecurity"]}.get(
        config, plugins["vap"] + (plugins["podSecurity"] if "restricted" in config else 0.0)
    )


def slope_us(points: list[tuple[int, float]]) -> float:
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs) * 1000


def summarise(phases: list[dict[str, Any]]) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    for containers in sorted({p["containers"] for p in phases}):
        row: dict[str, Any] = {}
        for config in CONFIGS:
            mine = [p for p in phases if p["containers"] == containers and p["config"] == config]
            if not mine:
                continue
            plugins = {k: statistics.median(p["plugins"][k]["meanMs"] for p in mine) for k in PLUGINS}
            row[config] = {
                "pluginMs": plugins,
                "costMs": round(cost(config, plugins), 4),
                "cpuMsPerCreate": statistics.median(p["cpuMsPerCreate"] for p in mine),
                **{k: statistics.median(p["client"][k] for p in mine) for k in ("createsPerSecond", "p50Ms", "p99Ms")},
            }
        guard = row["guard"]["costMs"]
        row["ratios"] = {
            "guardOverFloor": round(guard / row["floor"]["costMs"], 2),
            "guardOverRestricted": round(guard / row["restricted"]["costMs"], 1),
            "guardThroughputOverNone": round(row["guard"]["createsPerSecond"] / row["none"]["createsPerSecond"], 3),
            "fastPathSaving": round(1 - guard / row["per-rule"]["costMs"], 3),
            **({"scopedOutsideOverFloor": round(row["scoped"]["costMs"] / row["floor"]["costMs"], 2)}
               if "scoped" in row else {}),
        }  # fmt: skip
        table[str(containers)] = row
    sizes = [int(c) for c in table]
    growth = {c: round(slope_us([(n, table[str(n)][c]["costMs"]) for n in sizes]), 2) for c in CONFIGS if c != "none"}
    goals = {}
    for n, limits in GOALS.items():
        if str(n) in table:
            ratios = table[str(n)]["ratios"]
            goals[str(n)] = {
                f"guardOver{other.capitalize()}": {"goal": limit, "measured": ratios[f"guardOver{other.capitalize()}"]}
                for other, limit in limits.items()
            }
    return {"bySize": table, "growthUsPerContainer": growth, "goals": goals,
            "goalUsPerContainer": GOAL_PER_CONTAINER_US}  # fmt: skip


def table(summary: dict[str, Any]) -> str:
    """docs/performance.md's table, from a record's medians."""
    lines = [
        "| containers | restricted ms | floor ms | guard ms without its fast path | guard ms | guard / floor "
        "| guard / restricted "
        "| guard + restricted ms | scoped guard, pod outside its scope ms (/ floor) "
        "| API-server CPU ms per create, none / guard |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, row in summary["bySize"].items():
        earlier = row["per-rule"]["costMs"]
        lines.append(
            f"| {n} | {row['restricted']['costMs']:.3f} | {row['floor']['costMs']:.3f} | {earlier:.2f} "
            f"| {row['guard']['costMs']:.2f} | {row['ratios']['guardOverFloor']:.1f}x "
            f"| {row['ratios']['guardOverRestricted']:.0f}x | {row['guard+restricted']['costMs']:.2f} "
            f"| {row['scoped']['costMs']:.3f} ({row['ratios']['scopedOutsideOverFloor']:.1f}x) "
            f"| {row['none']['cpuMsPerCreate']:.1f} / {row['guard']['cpuMsPerCreate']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    arguments = argparse.ArgumentParser(prog="python -m lab.admission_compare", description=__doc__.split("\n\n")[0])
    arguments.add_argument("--creates", type=int, default=240, help="dry-run creates per phase at 1-4 containers")
    arguments.add_argument("--rounds", type=int, default=3, help="rounds over every configuration and size")
    arguments.add_argument("--workers", type=int, default=2, help="concurrent clients")
    arguments.add_argument("--minor", default="", help="another minor's API server (1.35, 1.36, 1.38), etcd beside it")
    arguments.add_argument("--json-out", type=Path, help="also write the full results here")
    args = arguments.parse_args(argv)
    if not built("lab.admission_compare", args.minor):
        return 2
    results = measure(args.creates, args.rounds, args.workers, args.minor)
    results["command"] = "python -m lab.admission_compare " + " ".join(argv if argv is not None else sys.argv[1:])
    return said(results, args.json_out, indent=1)


if __name__ == "__main__":
    sys.exit(main())
