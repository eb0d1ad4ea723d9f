"""tools.bench: the baseline declares exactly the program's objects, and the command runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tools.bench import baseline_objects, synthetic_stack
from tools.program import run_program

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


def test_bench_command_prints_rows() -> None:
    command = [sys.executable, "-m", "tools.bench", "--nodes", "1,3", "--repeat", "1", "--json"]
    rows = json.loads(subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    assert [row["nodes"] for row in rows] == [1, 3]
    for row in rows:
        assert set(row) == {"nodes", "programSeconds", "baselineSeconds", "ratio", "peakMemoryBytes"}
        assert row["programSeconds"] > 0 and row["baselineSeconds"] > 0 and row["peakMemoryBytes"] > 2**20


def test_bench_rejects_bad_sizes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tools.bench", "--nodes", "ten"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 2 and result.stderr.startswith("error: --nodes ten")
