"""`audit --watch`: scan on an interval and publish the result as Prometheus metrics.

Over HTTP (--metrics-port) and/or as a node-exporter textfile (--textfile, written atomically by
prometheus-client). Alert on `hidden_gpu_audit_violations > 0` and on a stale
`hidden_gpu_audit_last_success_timestamp_seconds`: a scan that cannot see is not a clean scan.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, start_http_server, write_to_textfile

from common.cli import UnavailableError, UsageError
from host.report import Report

# How often --watch looks up from a running scan for SIGTERM.
STOP_POLL_SECONDS = 0.2


def _scan_once(scan: Callable[[], Report], outcome: list[tuple[Report | None, str | None]]) -> None:
    try:
        outcome.append((scan(), None))
    except (UnavailableError, UsageError) as error:
        outcome.append((None, str(error)))


def scan_forever(
    scan: Callable[[], Report],
    interval: float,
    stop: threading.Event,
    on_report: Callable[[Report | None, str | None], None],
) -> None:
    """Scan until `stop` is set; an unavailable source is a failed scan, reported, not an exit. Each scan
    runs in a daemon thread, so a scan stuck in a driver call or a socket never holds up a SIGTERM for
    longer than STOP_POLL_SECONDS; one that outlasts its interval is reported as failed meanwhile."""
    while not stop.is_set():
        outcome: list[tuple[Report | None, str | None]] = []
        worker = threading.Thread(target=_scan_once, args=(scan, outcome), name="audit scan", daemon=True)
        worker.start()
        started, stuck = time.monotonic(), False
        while worker.is_alive() and not stop.is_set():
            worker.join(STOP_POLL_SECONDS)
            if worker.is_alive() and not stuck and time.monotonic() - started > max(interval, STOP_POLL_SECONDS):
                stuck = True
                on_report(None, f"scan still running after {time.monotonic() - started:.0f} s")
        if stop.is_set():
            return
        if outcome:  # an exception outside the two kinds above ends the thread without one: not a clean scan
            on_report(*outcome[0])
        else:
            on_report(None, "scan failed unexpectedly")
        stop.wait(interval)


def heartbeat(report: Report) -> str:
    """The one line a successful scan prints."""
    processes = sum(len(gpu["processes"]) for gpu in report.gpus)
    return (
        f"scan ok: node {report.node}: {len(report.gpus)} GPU(s), {processes} GPU process(es), "
        f"{len(report.violations)} violation(s), {len(report.warnings)} warning(s)"
    )


class Watcher:
    def __init__(
        self,
        scan: Callable[[], Report],
        interval: float,
        port: int | None,
        textfile: Path | None,
        address: str = "0.0.0.0",
    ) -> None:
        self.scan, self.interval, self.port, self.textfile, self.address = scan, interval, port, textfile, address
        self.registry = CollectorRegistry()
        self.violations = Gauge(
            "hidden_gpu_audit_violations", "Violations found by the last scan", registry=self.registry
        )
        self.warnings = Gauge("hidden_gpu_audit_warnings", "Warnings found by the last scan", registry=self.registry)
        self.processes = Gauge(
            "hidden_gpu_audit_gpu_processes", "Processes on each GPU", ["uuid", "role"], registry=self.registry
        )
        self.series: set[tuple[str, str]] = set()  # the processes gauge's label sets, as the last scan set them
        self.scan_ok = Gauge("hidden_gpu_audit_scan_ok", "1 if the last scan could see, else 0", registry=self.registry)
        self.last_success = Gauge(
            "hidden_gpu_audit_last_success_timestamp_seconds", "When a scan last succeeded", registry=self.registry
        )

    def record(self, report: Report | None, error: str | None) -> None:
        if report is None:
            self.scan_ok.set(0)
            print(f"error: scan failed: {error}", file=sys.stderr, flush=True)
        else:
            self.violations.set(len(report.violations))
            self.warnings.set(len(report.warnings))
            series = {
                (gpu["uuid"], "exposed" if gpu["exposed"] else "hidden"): len(gpu["processes"]) for gpu in report.gpus
            }
            # Set first, then drop only the series of GPUs gone: a scrape between never misses a GPU still there.
            for labels, count in series.items():
                self.processes.labels(*labels).set(count)
            for labels in self.series - series.keys():
                self.processes.remove(*labels)
            self.series = set(series)
            self.scan_ok.set(0 if report.failed_sources else 1)
            if not report.failed_sources:
                self.last_success.set(time.time())
                print(heartbeat(report), flush=True)  # the journal shows the watch is alive and seeing
            for source in report.failed_sources:
                print(f"error: scan incomplete: {source}", file=sys.stderr, flush=True)
        if self.textfile is not None:
            write_to_textfile(str(self.textfile), self.registry)

    def run(self, stop: threading.Event) -> None:
        if self.port is not None:
            server, thread = start_http_server(self.port, addr=self.address, registry=self.registry)
            try:
                scan_forever(self.scan, self.interval, stop, self.record)
            finally:
                server.shutdown()
                server.server_close()
                thread.join()
        else:
            scan_forever(self.scan, self.interval, stop, self.record)
