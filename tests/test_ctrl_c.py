"""Ctrl-C while a tool starts (issue 33): render, verify and discover, each sent its own SIGINT at a chosen moment of
its start-up (common.cli's first import, the Nth import after it, the stack file opened, NVML's library loaded), end on
SIGINT or 130 with no traceback and no output left behind. The moment is found by a Python audit event in the tool's own
interpreter, never by sleeping, so the signal always lands before the tool has ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# Loaded by the tool's interpreter (sitecustomize on PYTHONPATH): sends the process its own Ctrl-C at one chosen
# moment, found by a Python audit event, and leaves a mark that it did. A moment picked by sleeping was a race: on
# a fast machine the tool had ended before the signal and the test checked nothing.
INTERRUPTER = """
import os, signal, sys
# Python's own Ctrl-C, as a terminal's user has it: a shell that started the test run in the background hands its
# children SIGINT ignored, and Python then never installs its handler.
signal.signal(signal.SIGINT, signal.default_int_handler)
_kind, _, _what = os.environ["HIDDEN_GPU_TEST_INTERRUPT"].partition(":")
_mark = os.environ["HIDDEN_GPU_TEST_MARK"]
_state = {"seen": 0, "fired": False}

def _fire(where):
    _state["fired"] = True
    with open(_mark, "w") as mark:
        mark.write(where)
    os.kill(os.getpid(), signal.SIGINT)

def _hook(event, args):
    if _state["fired"]:
        return
    if _kind == "import" and event == "import" and sys.excepthook is not sys.__excepthook__:
        # The Nth import once the tool's quiet Ctrl-C is in place (common.quiet_start, the rooms' first import).
        _state["seen"] += 1
        if _state["seen"] == int(_what):
            _fire(f"import {args[0]}")
    elif _kind == "module" and event == "import" and args[0] == _what:
        _fire(f"import {_what}")
    elif _kind == "open" and event == "open" and str(args[0]).endswith(_what):
        _fire(f"open {args[0]}")
    elif _kind == "event" and event == _what:
        _fire(event)

sys.addaudithook(_hook)
"""

# common.cli's first import: its own imports once came before the hook. Then imports counted once the hook is in place: render makes about 680, verify 880, discover 110 (2026-12-04).
MOMENTS = {
    "offline.render": ["module:common.cli", "import:1", "import:200", "import:500", "open:Pulumi.dev.yaml"],
    "cluster.verify": ["module:common.cli", "import:1", "import:300", "import:700", "open:Pulumi.dev.yaml"],
    # NVML's library loads: the moment discover meets the host (and, here, finds no driver).
    "host.discover": ["module:common.cli", "import:1", "import:50", "import:100", "event:ctypes.dlopen"],
}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("module", "moment"), [(module, moment) for module, moments in MOMENTS.items() for moment in moments]
)
def test_ctrl_c_while_a_tool_starts_prints_no_traceback(tmp_path: Path, module: str, moment: str) -> None:
    (tmp_path / "sitecustomize.py").write_text(INTERRUPTER)
    mark = tmp_path / "interrupted"
    arguments = {
        "offline.render": ["--stack", "dev", "--out", str(tmp_path / "out")],
        "cluster.verify": ["--stack", "dev"],
        "host.discover": ["--check", "--stack", "dev"],
    }[module]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "HIDDEN_GPU_TEST_INTERRUPT": moment,
        "HIDDEN_GPU_TEST_MARK": str(mark),
    }
    process = subprocess.run(
        [sys.executable, "-m", module, *arguments],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert mark.exists(), f"the tool ended before {moment}: {process.stderr}"
    assert "Traceback" not in process.stderr, (mark.read_text(), process.stderr)
    assert process.returncode in (-signal.SIGINT, 130), (mark.read_text(), process.returncode, process.stderr)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir()), "a Ctrl-C left output behind"
