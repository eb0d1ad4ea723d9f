"""`cluster.verify --textfile PATH`: the last verify of a stack as Prometheus metrics, for node-exporter's textfile
collector, written atomically by prometheus-client (a temporary file renamed over PATH), as host.audit writes its
own. Alerting rules for them: cluster/hidden-gpu-verify.rules.yml.

Written after every run, whatever its end: a run that could not check (exit 2, 3 or 4) says so (`checked` 0, no
per-check series) and keeps the last success's timestamp, read back from the file it replaces. Labels name the
stack, and for each check its scope (a node, a namespace, `cluster`) and what it checks; never the expected or
actual value (they hold GPU UUIDs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from common.cli import EXIT_FINDING, EXIT_OK, UsageError

PREFIX = "hidden_gpu_verify"
LAST_SUCCESS = f"{PREFIX}_last_success_timestamp_seconds"
# What each metric says, by its name: the rules file may name only these (tests/test_verify_metrics.py).
METRICS = {
    f"{PREFIX}_exit_status": "Exit status of the last cluster.verify (0 ok, 1 mismatch, 2 usage, 3 unavailable, 4 bug)",
    f"{PREFIX}_checked": "1 if the last cluster.verify read the cluster and compared it, else 0",
    f"{PREFIX}_mismatches": "Mismatches the last cluster.verify found",
    f"{PREFIX}_check_ok": "1 if the check passed in the last cluster.verify, else 0",
    f"{PREFIX}_last_run_timestamp_seconds": "When cluster.verify last ran",
    LAST_SUCCESS: "When cluster.verify last ended with no mismatch (0: never)",
}


class CheckResult(Protocol):
    @property
    def scope(self) -> str: ...
    @property
    def what(self) -> str: ...
    @property
    def ok(self) -> bool: ...


def usable(path: Path) -> Path:
    """--textfile's directory must exist, as for host.audit: refused before the cluster is asked anything."""
    if not path.parent.is_dir():
        raise UsageError(f"--textfile {path}: no directory {path.parent}; create it first")
    if path.is_dir():
        raise UsageError(f"--textfile {path}: a directory; name the file to write")
    return path


def previous_success(path: Path, stack: str) -> float:
    """The last success recorded in the file this run replaces (0 where there is none, or it cannot be read)."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    try:
        text = path.read_text(encoding="utf-8", errors="replace")[:10_000_000]
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == LAST_SUCCESS and sample.labels.get("stack") == stack and math.isfinite(sample.value):
                    return float(sample.value)
    except (OSError, ValueError):  # missing, unreadable, or not the exposition format: never a success
        pass
    return 0.0


def write_textfile(path: Path, stack: str, status: int, checks: Iterable[CheckResult] | None, now: float) -> None:
    """The metrics of one run: `checks` is None when the run could not compare (status 2, 3 or 4)."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile  # noqa: PLC0415

    registry = CollectorRegistry()

    def gauge(name: str, *labels: str) -> Gauge:
        return Gauge(name, METRICS[name], ["stack", *labels], registry=registry)

    compared = checks is not None and status in (EXIT_OK, EXIT_FINDING)
    gauge(f"{PREFIX}_exit_status").labels(stack).set(status)
    gauge(f"{PREFIX}_checked").labels(stack).set(1 if compared else 0)
    gauge(f"{PREFIX}_last_run_timestamp_seconds").labels(stack).set(now)
    success = now if compared and status == EXIT_OK else previous_success(path, stack)
    gauge(LAST_SUCCESS).labels(stack).set(success)
    if compared and checks is not None:
        per_check = gauge(f"{PREFIX}_check_ok", "scope", "check")
        passed: dict[tuple[str, str], bool] = {}
        failed = 0
        for check in checks:
            # Two checks of one name on one scope are one series: it passes only if both did.
            passed[check.scope, check.what] = passed.get((check.scope, check.what), True) and check.ok
            failed += 0 if check.ok else 1
        for (scope, what), ok in passed.items():
            per_check.labels(stack, scope, what).set(1 if ok else 0)
        gauge(f"{PREFIX}_mismatches").labels(stack).set(failed)
    write_to_textfile(str(path), registry)
