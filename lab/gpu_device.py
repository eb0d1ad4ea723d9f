"""A GPU host run as the device machine allows it: a deadline before the machine's own 600 s, the logs packed into
OUT, what was measured written even when a phase fails, and the two verbs (`prepare` here, `run` there)."""

from __future__ import annotations

import argparse
import io
import os
import shutil
import signal
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.controlplane import ControlPlane
from e2e.node import (
    CHECKPOINT,
    Node,
)

DEADLINE_S = 540  # the device's `run` stops a command at 600 s: end first, with what was measured


def collect_logs(out: Path, node: Node | None, plane: ControlPlane | None, extra: dict[str, str]) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for name, text in extra.items():
            add(name, text.encode())
        for base in (node.root if node else None, plane.root if plane else None):
            if base is None:
                continue
            patterns = (
                "*.log",
                "toolkit/*",
                "cdi/*",
                "pod-logs/**/*.log",
                "kubelet/config.yaml",
                "containerd/config.toml",
            )
            for path in [found for pattern in patterns for found in base.glob(pattern)]:
                with suppress(OSError):
                    if path.is_file() and path.stat().st_size < 20 * 2**20:
                        add(f"{base.name}/{path.relative_to(base)}", path.read_bytes())
        with suppress(OSError):
            add("kubelet_internal_checkpoint", CHECKPOINT.read_bytes())
    (out / "logs.tar.gz").write_bytes(buffer.getvalue())


class DeadlineError(Exception):
    pass


@dataclass
class Held:
    """What a GPU-host run holds, for its logs whatever happens: its work directory, plane and node."""

    work: Path
    plane: ControlPlane | None = None
    node: Node | None = None
    extra: dict[str, str] = field(default_factory=dict)


@contextmanager
def device_run(out: Path, result: dict[str, Any], prefix: str, seconds: int) -> Iterator[Held]:
    """The run's frame: its own deadline, what failed written into `result` with the logs, the work directory gone."""
    out.mkdir(parents=True, exist_ok=True)
    held = Held(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        with deadline(seconds):
            yield held
    except Exception as error:  # what failed goes into the result, with the logs
        result["error"] = f"{type(error).__name__}: {error}"[-4000:]
        if not (out / "logs.tar.gz").exists():
            collect_logs(out, held.node, held.plane, held.extra)
    finally:
        shutil.rmtree(held.work, ignore_errors=True)


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    def expired(signum: int, frame: Any) -> None:
        raise DeadlineError(f"the run's own deadline ({seconds} s) passed")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def device_main(
    argv: list[str] | None,
    doc: str,
    *,
    carry: Path,
    plugin_xz: Path,
    prepare: Callable[[Path], int],
    run: Callable[[Path, Path, bool], int],
    rehearsal: bool,
) -> int:
    """A GPU-host run's two verbs: `prepare` here, `run` there as root (and `--rehearse` here, where it has one)."""
    prog = f"python -m lab.{doc.split(maxsplit=1)[0]}"
    parser = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[1],
        epilog=doc.split("\n\n")[2],  # the usage lines: each verb's flags
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="verb", required=True)
    prep = sub.add_parser("prepare", help=f"build, pack, render and copy the plugin into {carry}")
    prep.add_argument("--plugin-xz", type=Path, default=plugin_xz)
    go = sub.add_parser("run", help="run the node and the cases; as root")
    go.add_argument("--out", type=Path, required=True)
    go.add_argument("--carry", type=Path, default=carry)
    if rehearsal:
        go.add_argument("--rehearse", action="store_true", help="no GPU: the synthetic spec and the stand-in plugin")
    args = parser.parse_args(argv)
    if args.verb == "prepare":
        return prepare(args.plugin_xz)
    if os.geteuid() != 0:
        print(f"{prog}: runs containerd and a kubelet: run it as root", file=sys.stderr)
        return 2
    return run(args.carry, args.out, getattr(args, "rehearse", False))
