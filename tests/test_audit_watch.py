"""host.audit --watch (host/watch.py): the violation gauge a scrape reads moves with each scan and the textfile
catches up; a GPU's process series stays while the GPU is there and goes with it; a scan that cannot see is not a
clean scan; SIGTERM stops the loop without waiting for a hung scan; a textfile directory that does not exist is a
usage error."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from common.cli import EXIT_USAGE, UnavailableError
from common.names import Role
from host import audit
from host.report import Report
from host.watch import Watcher, scan_forever
from tests.support.audit_node import CGROUP_LAYOUTS, EXPOSED, HIDDEN, proc_tree, run_args
from tests.support.fake_nvml import FakeGpu, fake_nvml

THIRD = "GPU-cccccccc-1111-4222-8333-444455556666"


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in lines if line.startswith("hidden_gpu_")}


def wait_for(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_gpus_process_series_stays_while_it_is_there_and_goes_with_it() -> None:
    """The gauge per GPU is set anew each scan, never cleared first (a scrape then would miss GPUs still there);
    a GPU the scan no longer lists, or listed under another role, loses its old series."""
    watcher = Watcher(lambda: Report("gpu-node-01"), 1.0, None, None)

    def gpu(uuid: str, exposed: bool, processes: int) -> dict[str, object]:
        return {"uuid": uuid, "exposed": exposed, "processes": [{}] * processes}

    def value(uuid: str, role: str) -> float | None:
        labels = {"uuid": uuid, "role": role}
        return watcher.registry.get_sample_value("hidden_gpu_audit_gpu_processes", labels)

    watcher.record(Report("gpu-node-01", gpus=[gpu(EXPOSED, True, 2), gpu(HIDDEN, False, 0)]), None)
    assert (value(EXPOSED, "exposed"), value(HIDDEN, "hidden")) == (2.0, 0.0)
    # What a scrape would read after each change the next scan makes to the gauge.
    gauge, read = watcher.processes, []

    class Scraped:
        def __getattr__(self, name: str) -> Callable[..., object]:
            def call(*args: str) -> object:
                done = getattr(gauge, name)(*args)
                read.append(value(HIDDEN, "hidden"))
                return done

            return call

    watcher.processes = Scraped()  # type: ignore[assignment]
    watcher.record(Report("gpu-node-01", gpus=[gpu(HIDDEN, False, 1), gpu(THIRD, False, 0)]), None)
    assert read and None not in read, read  # the hidden GPU, there in both scans, was never missing
    watcher.processes = gauge
    assert (value(HIDDEN, "hidden"), value(THIRD, "hidden"), value(EXPOSED, "exposed")) == (1.0, 0.0, None)


def test_watch_publishes_the_violation_gauge_as_it_moves(tmp_path: Path, unused_port: int) -> None:
    proc_tree(tmp_path, {100: CGROUP_LAYOUTS["v2-systemd-containerd"]})
    hidden = FakeGpu(HIDDEN)
    sources = audit.Sources(
        fake_nvml([FakeGpu(EXPOSED), hidden]), tmp_path / "proc", tmp_path / "log", tmp_path / "none.sock"
    )
    roles = {EXPOSED: Role.EXPOSED, HIDDEN: Role.HIDDEN}
    scans: list[int] = []

    def scan() -> Report:
        report = audit.audit(sources, "gpu-node-01", roles)
        scans.append(len(report.violations))
        return report

    textfile = tmp_path / "hidden_gpu.prom"
    watcher = Watcher(scan, 0.05, unused_port, textfile, "127.0.0.1")
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: bool(scans) and scrape(unused_port).get("hidden_gpu_audit_scan_ok") == 1.0)
        assert scrape(unused_port)["hidden_gpu_audit_violations"] == 0.0
        hidden.compute = [(100, 1)]  # a pod's process appears on the hidden GPU
        wait_for(lambda: scrape(unused_port)["hidden_gpu_audit_violations"] == 1.0)
        key = f'hidden_gpu_audit_gpu_processes{{role="hidden",uuid="{HIDDEN}"}}'
        wait_for(lambda: scrape(unused_port).get(key) == 1.0)  # set by the scan that counted the violation
        hidden.compute = []
        wait_for(lambda: scrape(unused_port)["hidden_gpu_audit_violations"] == 0.0)
        assert scrape(unused_port)["hidden_gpu_audit_last_success_timestamp_seconds"] > 0
        # The textfile is written (atomically) after the gauges are set: it catches up within a scan.
        wait_for(lambda: "hidden_gpu_audit_violations 0.0" in textfile.read_text())
    finally:
        stop.set()
        thread.join()


def test_a_scan_that_cannot_see_is_not_a_clean_scan(tmp_path: Path, unused_port: int) -> None:
    def blind() -> Report:
        raise UnavailableError("no NVIDIA driver here")

    watcher = Watcher(blind, 0.05, None, tmp_path / "m.prom", "127.0.0.1")
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,))
    thread.start()
    wait_for((tmp_path / "m.prom").exists)
    stop.set()
    thread.join()
    text = (tmp_path / "m.prom").read_text()
    assert "hidden_gpu_audit_scan_ok 0.0" in text and "hidden_gpu_audit_violations" not in text.split("scan_ok")[1]


def test_watch_stops_at_sigterm_without_waiting_for_a_hung_scan(tmp_path: Path) -> None:
    """A scan stuck in a driver call: the signal handler only sets the event; the loop must notice."""
    stuck = threading.Event()
    reports: list[str | None] = []

    def hanging() -> Report:
        stuck.set()
        threading.Event().wait(600)
        raise AssertionError("unreachable")

    stop = threading.Event()
    loop = threading.Thread(target=scan_forever, args=(hanging, 0.3, stop, lambda _r, e: reports.append(e)))
    loop.start()
    assert stuck.wait(5)
    waited = time.monotonic()
    while not reports and time.monotonic() - waited < 5:  # past its interval: reported as failed meanwhile
        time.sleep(0.02)
    stop.set()
    loop.join(5)  # the hung scan waits 600 s: a loop that waited for it would still be alive
    assert not loop.is_alive()
    assert reports and reports[0] is not None and reports[0].startswith("scan still running after")


def test_a_missing_textfile_directory_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc_tree(tmp_path, {})
    args = [*run_args(tmp_path), "--watch", "--textfile", str(tmp_path / "no/such/m.prom")]
    assert audit.main(args, nvml=fake_nvml([FakeGpu(EXPOSED)])) == EXIT_USAGE
    assert "--textfile" in capsys.readouterr().err
