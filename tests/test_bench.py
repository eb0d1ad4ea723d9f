"""offline.bench and the mock harness it times: the baseline declares exactly the program's objects,
the command runs, and a run resolves exports and leaves the collector as it was."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import threading
import traceback
import warnings
from pathlib import Path

import pulumi
import pytest

from offline import bench
from offline.bench import baseline_objects, synthetic_stack
from offline.program import run_callable, run_program

ROOT = Path(__file__).resolve().parent.parent


def test_synthetic_stack_is_valid_and_sized() -> None:
    stack = synthetic_stack(3)
    nodes = stack["hidden-gpu:nodes"]
    assert len(nodes) == 3 and all(len(n["exposedGpus"]) == 2 and len(n["hiddenGpus"]) == 6 for n in nodes)
    assert len({uuid for n in nodes for uuid in n["exposedGpus"] + n["hiddenGpus"]}) == 24
    run_program(stack, "bench")  # valid: the program accepts it


def test_baseline_declares_the_same_objects_as_the_program() -> None:
    program = sorted(
        (r.type, r.name, json.dumps(r.inputs, sort_keys=True))
        for r in run_program(synthetic_stack(4), "bench").kubernetes_objects
    )
    baseline = sorted((t, n, json.dumps(o, sort_keys=True)) for t, n, o in baseline_objects(4))
    assert baseline == program


@pytest.mark.subprocess
@pytest.mark.slow  # 8 s of real program runs: make test-all
def test_bench_command_prints_rows() -> None:
    command = [sys.executable, "-m", "offline.bench", "--nodes", "1,3", "--repeat", "1", "--json"]
    rows = json.loads(subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    assert [row["nodes"] for row in rows] == [1, 3]
    for row in rows:
        assert set(row) == {"nodes", "programSeconds", "baselineSeconds", "ratio", "peakMemoryBytes"}
        assert row["programSeconds"] > 0 and row["baselineSeconds"] > 0 and row["peakMemoryBytes"] > 2**20


@pytest.mark.subprocess
def test_bench_rejects_bad_sizes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "offline.bench", "--nodes", "ten"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 2 and result.stderr.startswith("error: --nodes ten")


def test_exported_outputs_are_resolved_to_plain_values() -> None:
    def program() -> None:
        names = pulumi.Output.from_input(["gpu-node-01"])
        pulumi.export("nodes", {"names": names, "count": names.apply(len), "note": None})

    assert run_callable(program, "bench").outputs == {"nodes": {"names": ["gpu-node-01"], "count": 1, "note": None}}


def test_a_run_collects_young_garbage_only_and_restores_the_collector() -> None:
    seen = {}

    def program() -> None:
        before = gc.get_stats()[0]["collections"]
        for _ in range(10_000):
            cycle: list[object] = []
            cycle.append(cycle)
        seen["young collections"] = gc.get_stats()[0]["collections"] - before
        seen["older generations' thresholds"] = min(gc.get_threshold()[1:])

    thresholds = gc.get_threshold()
    run_callable(program, "bench")
    assert seen["young collections"] > 0  # garbage does not pile up until the end
    assert seen["older generations' thresholds"] > 10**6  # what the run keeps is not rescanned
    assert gc.get_threshold() == thresholds


def test_a_bench_worker_keeps_to_one_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the machine has (a 1-CPU runner too): the worker asks for exactly one of the CPUs it may use."""
    pinned: list[set[int]] = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 2, 5}, raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", lambda _pid, cpus: pinned.append(set(cpus)), raising=False)
    bench.pin_to_one_cpu()
    assert pinned == [{5}]


def test_what_a_run_abandons_is_finished_and_collected_inside_the_run() -> None:
    leftovers: list[asyncio.Task[None]] = []

    def program() -> None:
        # An Output built on a thread with no event loop: ensure_future raises and drops Pulumi's
        # coroutine unstarted, its traceback kept in a cycle that only the collector frees.
        output = pulumi.Output.from_input(1)
        kept: list[object] = []

        def build_elsewhere() -> None:
            try:
                output.apply(str)
            except RuntimeError as error:
                kept.extend((error, kept))

        worker = threading.Thread(target=build_elsewhere)
        worker.start()
        worker.join()
        assert kept, "the thread had an event loop after all"
        leftovers.append(asyncio.ensure_future(asyncio.sleep(3600)))  # work nobody awaits
        raise ValueError("the program fails")

    unraisable: list[str] = []
    try:
        run_callable(program, "bench")
    except ValueError as failure:  # let go of at the end of the block, as a caller would
        lines = "".join(traceback.format_tb(failure.__traceback__))
    assert "raise ValueError" in lines  # the traceback keeps its lines
    assert leftovers.pop().cancelled()
    hook, sys.unraisablehook = sys.unraisablehook, lambda raised: unraisable.append(str(raised.exc_value))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            gc.collect()
    finally:
        sys.unraisablehook = hook
    assert unraisable == []
