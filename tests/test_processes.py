"""The testbed's process supervisor (e2e/processes.py), with shell children standing in for the servers."""

from __future__ import annotations

import time
from pathlib import Path

from e2e.processes import Processes

# Records its own SIGTERM after `pause` seconds, then exits: the order of the lines in the shared file is the order
# in which the processes finished stopping.
TERM_LOGGER = "trap 'sleep {pause}; echo {name} >> {order}; exit 0' TERM; while :; do sleep 0.05; done"


def test_stop_asks_the_newest_first_and_each_is_gone_before_the_next(tmp_path: Path) -> None:
    processes = Processes(tmp_path)
    order = tmp_path / "order"
    for name, pause in (("etcd", 0), ("kube-apiserver", 0), ("kwok", 0.5)):  # the newest is the slowest to go
        processes.spawn(name, ["sh", "-c", TERM_LOGGER.format(name=name, order=order, pause=pause)])
    time.sleep(0.3)  # the traps set
    processes.stop()
    assert order.read_text().split() == ["kwok", "kube-apiserver", "etcd"]
    assert processes.running == {}


def test_a_process_that_ignores_sigterm_is_killed_after_the_wait(tmp_path: Path) -> None:
    processes = Processes(tmp_path)
    processes.spawn("stubborn", ["sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"])
    time.sleep(0.2)
    started = time.monotonic()
    processes.stop(seconds=0.5)
    assert 0.5 <= time.monotonic() - started < 5
    assert "stubborn" not in processes


def test_an_exited_process_is_named_with_its_status_and_log(tmp_path: Path) -> None:
    processes = Processes(tmp_path)
    processes.spawn("server", ["sh", "-c", "echo listening failed >&2; exit 3"])
    processes.running["server"].wait()
    assert processes.exited() == "server exited (3): listening failed\n"
    processes.terminate("server")  # stopped on purpose: no longer reported
    assert processes.exited() is None


def test_restart_runs_the_first_command_line_with_its_environment_again(tmp_path: Path) -> None:
    processes = Processes(tmp_path)
    processes.spawn("echo", ["sh", "-c", 'echo "run $MARK"; sleep 30'], env={"MARK": "kept", "PATH": "/usr/bin:/bin"})
    time.sleep(0.2)
    processes.restart("echo")
    time.sleep(0.2)
    assert processes.log("echo") == "run kept\nrun kept\n"
    processes.stop()
