"""e2e.build says what it does while a group builds: a cold build is minutes of go's silence per group."""

from __future__ import annotations

import re
import time

import pytest

from e2e import build


def test_a_line_at_the_start_then_one_per_interval_with_the_time_so_far(capsys: pytest.CaptureFixture[str]) -> None:
    # Waits for the ticks rather than sleeping a fixed time: on a loaded 2-core runner a tick can come late.
    out = ""
    started = time.monotonic()  # before the ticker starts and after it has ended: bounds every tick it printed
    with build.progress("k8s", every=0.05):
        while out.count("still building") < 3 and time.monotonic() - started < 10:
            time.sleep(0.01)
            out += capsys.readouterr().out
    elapsed = time.monotonic() - started
    lines = (out + capsys.readouterr().out).splitlines()
    assert lines[0] == "k8s: building (not cached)"
    ticks = lines[1:]
    assert 3 <= len(ticks) <= elapsed / 0.05 + 1, (elapsed, lines)  # never faster than one per interval
    assert all(re.fullmatch(r"k8s: still building, \d+ s so far", line) for line in ticks), lines
    time.sleep(0.15)
    assert capsys.readouterr().out == ""  # the ticker ends with the build


def test_the_ticker_ends_when_the_build_fails(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError), build.progress("etcd", every=0.05):
        raise RuntimeError("go build failed")
    # A stalled runner may let a tick through before the failure: the claim is that none comes after it.
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "etcd: building (not cached)"
    assert all(line.startswith("etcd: still building") for line in lines[1:]), lines
    time.sleep(0.15)
    assert capsys.readouterr().out == ""


def test_every_progress_line_is_a_minute_apart_by_default() -> None:
    assert build.PROGRESS_SECONDS == 60.0
