"""lab.admission_compare's summary: medians over rounds, each configuration's cost from its own plugin, the
ratios and the growth per container the goals of issue 43 are judged by. The run itself:
tests/real/test_admission_compare.py."""

from __future__ import annotations

from typing import Any

import pytest

from lab import admission_compare as compare


def test_the_summary_is_made_of_the_phases_medians() -> None:
    def phase(containers: int, config: str, vap: float, psa: float, round_: int) -> dict[str, Any]:
        client = {"createsPerSecond": 100.0 - containers, "p50Ms": 1.0, "p99Ms": 2.0}
        plugins = {"vap": {"count": 30, "meanMs": vap}, "podSecurity": {"count": 30, "meanMs": psa}}
        return {"round": round_, "containers": containers, "config": config, "creates": 30, "client": client,
                "plugins": plugins, "cpuMsPerCreate": 1.0}  # fmt: skip

    phases = []
    for round_, noise in enumerate((0.0, 0.5, 0.01)):  # the middle round is the outlier the median drops
        for n in (1, 64):
            guard = 0.3 + 0.01 * n
            values = {"none": (0.05, 0.01), "baseline": (0.05, 0.02), "restricted": (0.05, 0.03),
                      "floor": (0.1, 0.01), "guard": (guard, 0.01), "guard+restricted": (guard, 0.03),
                      "per-rule": (2 * guard, 0.01), "scoped": (0.12, 0.01)}  # fmt: skip
            phases += [phase(n, c, v + noise, p, round_) for c, (v, p) in values.items()]
    summary = compare.summarise(phases)
    one = summary["bySize"]["1"]
    assert one["guard"]["costMs"] == pytest.approx(0.32)
    assert one["restricted"]["costMs"] == pytest.approx(0.03)
    assert one["guard+restricted"]["costMs"] == pytest.approx(0.35)
    assert one["ratios"]["guardOverFloor"] == round(0.32 / 0.11, 2)  # the medians, not the outlier round
    assert summary["growthUsPerContainer"]["guard"] == pytest.approx(10.0)
    assert one["ratios"]["fastPathSaving"] == round(1 - 0.32 / (2 * 0.31 + 0.01), 3)  # medians of each side
    assert one["ratios"]["scopedOutsideOverFloor"] == round(0.13 / 0.11, 2)  # medians again
    assert summary["goals"]["64"]["guardOverFloor"] == {"goal": 5.0, "measured": round(0.95 / 0.11, 2)}
