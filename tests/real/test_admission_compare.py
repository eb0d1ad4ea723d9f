"""The admission comparison (lab.admission_compare) run small, so it keeps measuring what it says: each
configuration's namespace judged by exactly its policies, the same pod admitted by all eight (`scoped`'s outside
its scope, and the same pod under the node's RuntimeClass judged), every dry-run create
counted by the plugins' own histograms; lab.admission_cost's three verdicts. The summary's arithmetic: tests/test_admission_compare.py."""

from __future__ import annotations

import copy
from typing import Any

from e2e.controlplane import ApiError, ControlPlane
from lab import admission_compare as compare
from lab import admission_cost as cost

GUARDED = {"guard", "guard+restricted", "per-rule"}


def denier(plane: ControlPlane, pod: dict[str, Any]) -> str:
    """Who denies the pod: 'guard', 'floor', 'podSecurity' or '' (admitted)."""
    try:
        plane.create(pod, dry_run=True)
    except ApiError as error:
        if "hidden-gpu guard" in error.message:
            return "guard"
        if "violates PodSecurity" in error.message:
            return "podSecurity"
        raise
    return ""


def test_each_configuration_is_judged_by_its_policies_alone() -> None:
    with compare.compare_plane() as (plane, runtime_class):
        for config in compare.CONFIGS:
            pod = compare.the_pod(runtime_class, 2, config)
            assert denier(plane, pod) == "", config  # the same pod passes every configuration
            routed = copy.deepcopy(pod)  # asks for every GPU through its env: only the guard objects
            routed["spec"]["containers"][1]["env"][0]["value"] = "all"
            assert denier(plane, routed) == ("guard" if config in GUARDED else ""), config
            rooted = copy.deepcopy(pod)  # runs as root with its privileges: restricted objects, baseline not
            del rooted["spec"]["containers"][0]["securityContext"]
            assert denier(plane, rooted) == ("podSecurity" if "restricted" in config else ""), config
        # The scoped guard leaves its own pod alone, and judges the same pod once it runs under the node's RuntimeClass.
        inside = compare.the_pod(runtime_class, 2, "scoped")
        inside["spec"]["runtimeClassName"] = runtime_class
        inside["spec"]["containers"][1]["env"][0]["value"] = "all"
        assert denier(plane, inside) == "guard"
        phases = [compare.phase(plane, compare.the_pod(runtime_class, 4, c), 30, 2) for c in compare.CONFIGS]
        # lab.admission_cost's verdicts, each as the API server gives it (the cost limit: a pod far past it).
        for containers, violating, expected in ((3, False, "admitted"), (3, True, "denied"), (8000, False, "cost")):
            shaped = cost.the_pod(runtime_class, containers, 0, violating, "guard")
            assert cost.verdict(plane, shaped) == expected, (containers, violating)
    for config, measured in zip(compare.CONFIGS, phases, strict=True):
        # Both plugins judged every create (the controllers' own creates may add to the count, never take).
        assert all(measured["plugins"][k]["count"] >= 30 for k in compare.PLUGINS), (config, measured)
        assert measured["cpuMsPerCreate"] > 0 and measured["client"]["createsPerSecond"] > 0, (config, measured)
