"""One error path for every tool: a problem is one line and its own exit status, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cluster import verify
from common.cli import (
    EXIT_INTERNAL,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    UnavailableError,
    UsageError,
    run,
    stack_files,
    stack_name_of,
)
from host import audit, discover
from offline import diff, render
from tests.support.fake_nvml import FakeGpu, fake_nvml
from tests.support.stacks import EXPOSED, changed, node, valid_config, write_stack


def boom() -> int:
    raise KeyError("an input nobody foresaw")


@pytest.mark.parametrize(
    ("failure", "status", "line"),
    [
        (UsageError("--out x: bad"), EXIT_USAGE, "error: --out x: bad"),
        (UnavailableError("no driver"), EXIT_UNAVAILABLE, "error: no driver"),
        (KeyError("surprise"), EXIT_INTERNAL, "error: internal error: KeyError: 'surprise' (--debug shows where)"),
    ],
)
def test_each_kind_of_failure_has_its_status(
    failure: Exception, status: int, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def command() -> int:
        raise failure

    assert run(command) == status
    assert capsys.readouterr().err == line + "\n"


def test_debug_shows_the_traceback_of_an_internal_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(boom, debug=True) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("error: internal error: KeyError: 'an input nobody foresaw'\n")


def test_a_huge_message_is_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    def command() -> int:
        raise ValueError("x" * 100_000 + "\n" * 50)

    assert run(command) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 300


def broken_nvml() -> object:
    nvml = fake_nvml([FakeGpu(EXPOSED)])

    def count() -> int:
        raise RuntimeError("driver answered nonsense")

    nvml.nvmlDeviceGetCount = count  # type: ignore[attr-defined]
    return nvml


TOOLS: dict[str, Callable[[Path], int]] = {
    "discover": lambda tmp: discover.main(["--json"], nvml=broken_nvml()),  # type: ignore[arg-type]
    "audit": lambda tmp: audit.main(
        ["--stack-file", str(write_stack(tmp, valid_config())), "--node", "gpu-node-01"],
        nvml=broken_nvml(),  # type: ignore[arg-type]
    ),
}


@pytest.mark.parametrize("tool", TOOLS)
def test_an_unexpected_error_in_a_host_tool_is_status_4(
    tool: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert TOOLS[tool](tmp_path) == EXIT_INTERNAL
    assert (
        capsys.readouterr().err
        == "error: internal error: RuntimeError: driver answered nonsense (--debug shows where)\n"
    )


def test_verify_prints_every_config_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def two_mistakes(config: dict[str, Any]) -> None:
        node(config)["exposedGpus"] = [0]
        node(config, 1)["name"] = "Bad_Name"

    config = changed(two_mistakes)
    assert verify.main(["--stack-file", str(write_stack(tmp_path, config))]) == EXIT_USAGE
    lines = capsys.readouterr().err.splitlines()
    where = tmp_path / "Pulumi.case.yaml"
    assert len(lines) == 2 and lines[0].startswith(f"error: {where}:8: hidden-gpu:nodes[0].exposedGpus[0] = 0")
    assert lines[1].startswith(f"error: {where}:12: hidden-gpu:nodes[1].name")


def test_diff_of_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert diff.main([str(tmp_path / "nope"), str(tmp_path)]) == EXIT_USAGE
    assert capsys.readouterr().err == f"error: {tmp_path / 'nope'}: not a directory\n"


def test_render_of_a_missing_stack(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert render.main(["--stack", "nope", "--out", str(tmp_path / "o")]) == EXIT_USAGE
    known = ", ".join(stack_name_of(p) for p in stack_files())
    assert capsys.readouterr().err.startswith(
        f"error: --stack nope: no stack file Pulumi.nope.yaml in stacks/ (stacks: {known})"
    )


@pytest.mark.parametrize("module", ["cluster.verify", "cluster.release", "offline.render"])
def test_a_tool_run_outside_its_virtualenv_says_so_in_one_line(module: str) -> None:
    """issue 42, 5: the README's `python -m cluster.verify` with a Python that lacks the project's packages ended in
    a traceback. `-S` leaves the interpreter without its site-packages, as a system Python is."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-S", "-m", module, "--stack", "prod"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and f"`.venv/bin/python -m {module}`" in done.stderr, done.stderr
