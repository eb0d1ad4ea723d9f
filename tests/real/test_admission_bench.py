"""The admission benchmark (lab.admission_bench) run small, so it keeps measuring what it says: every create
counted by the API server's own admission histogram, and each phase ending with the guard as it began (bound:
a probe denied; unbound: admitted)."""

from __future__ import annotations

from e2e.build import GROUPS, module_version
from lab import admission_bench


def test_the_benchmark_measures_the_guard_and_only_when_bound() -> None:
    results = admission_bench.measure(pods=40, rounds=2, workers=2)
    # The version the k8s group pins is the one that answered (the record names it).
    assert results["kubeApiserver"] == module_version(next(g for g in GROUPS if g.name == "k8s"))
    assert len(results["phases"]) == 2 * 2 * 2
    for phase in results["phases"]:
        count = 40 if phase["pod"] == "ordinary" else 1
        assert phase["client"]["createsPerSecond"] > 0, phase
        # The ValidatingAdmissionPolicy plugin judges every create (and the controllers' own, meanwhile).
        assert phase["vapPlugin"]["count"] >= count, phase
        assert phase["vapPlugin"]["meanMs"] is not None and phase["vapPlugin"]["meanMs"] > 0, phase
        assert phase["guardHeld"] == phase["guard"], phase
    assert set(results["summary"]) == {"ordinary", "largest"}
    assert results["largestPodBytes"] > 900_000
