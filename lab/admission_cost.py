"""How far the guard is from the API server's CEL cost limit (issue 43, 3): a benchmark, not a test.

    python -m lab.admission_cost [--minor 1.36] [--json-out FILE]

On the real kube-apiserver with prod's rendered guard (lab.admission_compare's `guard` namespace), the largest pod
the guard still judges, found by doubling then bisecting the number of containers, for two shapes of container
(small: one GPU each, as the cheapest container the guard reads whole; padded: as tests/real/test_admission.py's
largest pod, a kilobyte of env each) and two verdicts (admitted: every container passes, so the fast path alone
runs; denied: only the last container fails, so the fast path and then every rule scan all of them, the most a
pod can cost). A pod is past the limit when the API server answers with a CEL cost error (fail closed: the pod is
denied) and past the request limit when it refuses the body (413). The margin of the 1,200-container pod is the
largest judged over 1,200. The pod policy without its fast path (lab.admission_compare's `per-rule`) is measured
beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from e2e.controlplane import ApiError, ControlPlane
from lab.admission_compare import compare_plane, pod_of, restricted_container

START, CEILING = 1200, 40_000
SHAPES = {"small": 0, "padded": 1000}
# The guard, and its pod policy without the fast path (lab.admission_compare's per-rule copy): what it changed.
CONFIGS = ("guard", "per-rule")


def the_pod(runtime_class: str, containers: int, pad: int, violating: bool, config: str) -> dict[str, Any]:
    def one(index: int) -> dict[str, Any]:
        built = restricted_container(f"c{index}", gpu=not (violating and index == containers - 1))
        built.pop("env", None)
        built["resources"] = built.get("resources") or {}
        if pad:
            built["env"] = [{"name": "PAD", "value": "x" * pad}]
        return built

    return pod_of([one(i) for i in range(containers)], runtime_class, config)


def verdict(plane: ControlPlane, pod: dict[str, Any]) -> str:
    """admitted, denied (by a rule), cost (the CEL cost limit) or size (the request refused for its size)."""
    try:
        plane.create(pod, dry_run=True)
    except ApiError as error:
        if error.code == 413:
            return "size"
        if "cost" in error.message.lower():
            return "cost"
        if "hidden-gpu guard" in error.message:
            return "denied"
        raise
    return "admitted"


def largest(plane: ControlPlane, runtime_class: str, pad: int, violating: bool, config: str) -> dict[str, Any]:
    """The most containers judged with the expected verdict, and what stopped it past that."""
    expected = "denied" if violating else "admitted"
    good, bad, stopped = 0, None, ""
    n = START
    while bad is None and n <= CEILING:
        found = verdict(plane, the_pod(runtime_class, n, pad, violating, config))
        if found == expected:
            good, n = n, n * 2
        else:
            bad, stopped = n, found
    while bad is not None and bad - good > max(1, good // 100):  # to within 1 %
        mid = (good + bad) // 2
        found = verdict(plane, the_pod(runtime_class, mid, pad, violating, config))
        if found == expected:
            good = mid
        else:
            bad, stopped = mid, found
    return {
        "largestJudged": good,
        "stoppedBy": stopped or f"none up to {CEILING}",
        "marginOver1200": round(good / 1200, 2),
    }


def measure(minor: str = "") -> dict[str, Any]:
    results: dict[str, Any] = {}
    with compare_plane(minor) as (plane, runtime_class):
        results["kubeApiserver"] = plane.request("GET", "/version").get("gitVersion")
        for config in CONFIGS:
            for shape, pad in SHAPES.items():
                for violating in (False, True):
                    key = f"{shape}, {'denied at the last container' if violating else 'admitted'}"
                    results.setdefault(config, {})[key] = largest(plane, runtime_class, pad, violating, config)
    return results


def main(argv: list[str] | None = None) -> int:
    arguments = argparse.ArgumentParser(prog="python -m lab.admission_cost", description=__doc__.split("\n\n")[0])
    arguments.add_argument("--minor", default="", help="another minor's API server (1.35, 1.36, 1.38), etcd beside it")
    arguments.add_argument("--json-out", type=Path, help="also write the results here")
    args = arguments.parse_args(argv)
    results = {"command": "python -m lab.admission_cost " + " ".join(argv if argv is not None else sys.argv[1:]),
               **measure(args.minor)}  # fmt: skip
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
