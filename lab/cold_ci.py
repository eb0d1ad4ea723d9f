"""The cold CI runs recorded in docs/measurements/ as one table, the only place docs/performance.md states their
figures (tests/test_docs.py holds the two in step).

    python -m lab.cold_ci          # prints the table

A run is `git clone . /tmp/cold && cd /tmp/cold && make render STACK=prod && make test && bash .ci/run` with the Go
module, build and binary caches empty; each record says what else the machine did meanwhile.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEASUREMENTS = Path(__file__).resolve().parents[1] / "docs" / "measurements"
# The first cold run recorded, inside the GPU Operator's record (its group had just joined).
OPERATOR_RECORD = "gpu-operator-2core.json"
# The records in the order they ran (two a day, so the date alone does not tell); a new one goes last.
ORDER = (
    OPERATOR_RECORD,
    "cold-ci-1.37-2core.json",
    "cold-ci-minors-2core.json",
    "cold-ci-typecheck-2core.json",
    "cold-ci-prefetch-2core.json",
    "cold-ci-nodwarf-2core.json",
)
HEADER = (
    "| record | date | commit | `.ci/run` | builds | test-all | tests/real | tests/node |",
    "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
)


@dataclass(frozen=True)
class Run:
    record: str
    date: str
    commit: str
    ci_run: float
    builds: float
    # (seconds, tests) of each pytest run.
    suites: tuple[tuple[float, int], ...]


def _one(seconds: dict[str, Any], prefix: str) -> tuple[str, Any]:
    (found,) = [(key, value) for key, value in seconds.items() if key.startswith(prefix)]
    return found


def _suite(seconds: dict[str, Any], prefix: str) -> tuple[float, int]:
    key, value = _one(seconds, prefix)
    return float(value), int(re.sub(r"[^0-9]", "", key.split("(", 1)[1].split(" ", 1)[0]))


def _commit(what: str) -> str:
    return str(re.findall(r"commit ([0-9a-f]{7})", what)[0])


def cold_run(path: Path) -> Run:
    data = json.loads(path.read_text())
    if path.name == OPERATOR_RECORD:
        cold = data["cold_ci"]
        tests = {k: re.findall(r"([0-9]+) passed in ([0-9.]+) s", v)[0] for k, v in cold["tests"].items()}
        suites = tuple((float(tests[k][1]), int(tests[k][0])) for k in ("test-all", "tests/real", "tests/node"))
        builds = cold["build_seconds"]["total"]
        return Run(path.name, data["date"], cold["commit"], cold["seconds"][".ci/run"], builds, suites)
    seconds = data["seconds"]
    builds = seconds.get("builds total", sum(seconds["builds"].values()))
    suites = tuple(_suite(seconds, prefix) for prefix in ("test-all", "tests/real", "tests/node"))
    return Run(path.name, data["date"], _commit(data["what"]), _one(seconds, ".ci/run")[1], builds, suites)


def runs(directory: Path = MEASUREMENTS) -> list[Run]:
    unlisted = sorted({p.name for p in directory.glob("cold-ci-*.json")} - set(ORDER))
    if unlisted:
        raise ValueError(f"{unlisted}: add each to lab/cold_ci.py ORDER, in the order the runs were made")
    return [cold_run(directory / name) for name in ORDER]


def _minutes(seconds: float) -> str:
    return f"{int(seconds) // 60} min {round(seconds) % 60} s"


def table(found: list[Run]) -> str:
    rows = [
        f"| `{r.record}` | {r.date} | {r.commit} | {_minutes(r.ci_run)} | {r.builds:.0f} s | "
        + " | ".join(f"{s:.0f} s ({n})" for s, n in r.suites)
        + " |"
        for r in found
    ]
    return "\n".join([*HEADER, *rows])


def main() -> int:
    print(table(runs()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
