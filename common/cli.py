"""The one error path of every command-line tool, its exit statuses, and what tools print alike.

Standard library only: the GPU-host tools import it too.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import math
import os
import signal
import stat
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

from common.quiet_start import TOOL_PROCESS

# Exit statuses, the same for every tool. A gate can tell a finding (1) from a crash (4).
EXIT_OK = 0
EXIT_FINDING = 1  # the check ran and found a mismatch or a violation
EXIT_USAGE = 2  # bad arguments, an invalid stack file, an unusable directory or kubeconfig
EXIT_UNAVAILABLE = 3  # what the tool reads cannot answer: NVML, the kubelet, the API server
EXIT_INTERNAL = 4  # an unexpected error: a bug or an input nobody foresaw, never a result

# Where `--stack NAME` looks: the project's stackConfigDir (Pulumi.yaml), and how its files are named.
STACKS_DIR = Path(__file__).resolve().parent.parent / "stacks"
STACK_FILE_GLOB = "Pulumi.*.yaml"
# Error messages quote at most this much of a bad value.
SHOWN_VALUE_CHARS = 80
# A path a tool took and says so (a KUBECONFIG): whole in practice, still one bounded line.
SHOWN_PATH_CHARS = 400
# How a tool ends when the reader of its output goes away (`| head`): as if killed by SIGPIPE, as `cat` does.
EXIT_CLOSED_PIPE = 128 + 13


class ToolError(Exception):
    """A failure the user can act on: printed as one line per problem, no traceback."""

    exit_status = EXIT_USAGE


class UsageError(ToolError):
    """Bad arguments, an unusable output directory, an invalid stack file: EXIT_USAGE."""


class UnavailableError(ToolError):
    """What the tool reads cannot answer (NVML, the kubelet's socket, the API server): EXIT_UNAVAILABLE."""

    exit_status = EXIT_UNAVAILABLE


# What the machine refused, and what to do about it: the user's environment, never a bug (EXIT_INTERNAL).
_OS_ERRORS: dict[int, tuple[int, str]] = {
    errno.ENOSPC: (EXIT_UNAVAILABLE, "free some space, then run again"),
    errno.EDQUOT: (EXIT_UNAVAILABLE, "free some space (disk quota), then run again"),
    errno.EROFS: (EXIT_USAGE, "the file system is read-only: choose a writable path"),
    errno.EACCES: (EXIT_USAGE, "permission denied: choose a path you may use, or run as a user who may"),
    errno.EPERM: (EXIT_USAGE, "not permitted: choose a path you may use, or run as a user who may"),
    errno.ENOENT: (EXIT_USAGE, "no such file or directory: create it, or give another path"),
    errno.ENOTDIR: (EXIT_USAGE, "a part of the path is not a directory: give another path"),
    errno.EISDIR: (EXIT_USAGE, "is a directory: give a file's path"),
    errno.EEXIST: (EXIT_USAGE, "appeared while this ran (another run writing the same place?): run again"),
    errno.ENOTEMPTY: (EXIT_USAGE, "changed while this ran (another run writing the same place?): run again"),
    errno.EADDRINUSE: (EXIT_USAGE, "the port is in use: choose another, or stop what listens there"),
    errno.EADDRNOTAVAIL: (EXIT_USAGE, "the address is not one of this machine's: choose another"),
    errno.EMFILE: (EXIT_UNAVAILABLE, "too many open files: raise the limit (ulimit -n), then run again"),
    errno.ENAMETOOLONG: (EXIT_USAGE, "the name is too long for the file system: give a shorter path"),
    errno.ELOOP: (EXIT_USAGE, "too many levels of symbolic links: give the path itself"),
}


def os_error(error: OSError) -> ToolError | None:
    """The ToolError an OSError of the user's environment stands for, or None for one that is a bug."""
    known = _OS_ERRORS.get(error.errno or -1)
    if known is None:
        return None
    status, advice = known
    where = f"{error.filename}: " if error.filename else ""
    failure = ToolError(f"{where}{error.strerror or type(error).__name__}; {advice}")
    failure.exit_status = status
    return failure


def bounded(text: str, limit: int = SHOWN_VALUE_CHARS) -> str:
    """At most `limit` characters of `text`, on one line: a bad value can be huge or multi-line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def print_errors(message: str) -> None:
    """One `error:` line on stderr per line of the message."""
    for line in message.splitlines():
        print(f"error: {line}", file=sys.stderr)


@contextlib.contextmanager
def error_path(debug: bool = False) -> Iterator[None]:
    """Every failure leaves as SystemExit with its own status and one line per problem on stderr.

    A ToolError says what to fix, and so does an OSError of the user's environment (disk full, a
    read-only or missing path, a port in use); anything else is an internal error (EXIT_INTERNAL),
    named by its type and a bounded message, with the traceback only under --debug.
    """
    try:
        yield
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except BrokenPipeError:
        # The reader left (`| head`): nothing to say to anyone. stdout goes to /dev/null so that the
        # interpreter's last flush at exit does not complain about the closed pipe either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(EXIT_CLOSED_PIPE) from None
    except Exception as error:
        failure = error if isinstance(error, ToolError) else os_error(error) if isinstance(error, OSError) else None
        if failure is not None:
            print_errors(str(failure))
            raise SystemExit(failure.exit_status) from None
        if debug:
            traceback.print_exc()
        hint = "" if debug else " (--debug shows where)"
        print_errors(f"internal error: {type(error).__name__}: {bounded(str(error), 200)}{hint}")
        raise SystemExit(EXIT_INTERNAL) from None


def run(command: Callable[[], int], debug: bool = False) -> int:
    """The exit status of `command`, or of the failure error_path turned it into."""
    try:
        with error_path(debug):
            status = command()
            sys.stdout.flush()  # a closed pipe is met here, on the error path, not at the interpreter's exit
            return status
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else EXIT_INTERNAL


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument said as every other problem is: one `error:` line, exit 2."""

    def error(self, message: str) -> NoReturn:
        print_errors(f"{bounded(message, 300)} (python -m {self.prog.removeprefix('python -m ')} --help)")
        raise SystemExit(EXIT_USAGE)


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """An argument parser with the options every tool has."""
    result = _Parser(prog=prog, description=(doc or "").strip().splitlines()[0])
    result.add_argument("--debug", action="store_true", help="show the traceback of an internal error")
    return result


def positive_seconds(text: str) -> float:
    """A duration argument (`--deadline`, `--interval`): a finite number of seconds above zero. Zero, a negative,
    `nan` or `inf` would end a wait before it starts, spin, or never end."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{bounded(text)}: not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{bounded(text)}: must be a number of seconds above 0")
    return value


def port_number(text: str) -> int:
    """A TCP port to listen on: 1 to 65535."""
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
        raise argparse.ArgumentTypeError(f"{bounded(text)}: not a port number (1-65535)")
    return int(text)


class FileRefusedError(UsageError):
    """A file a tool reads that is no file to read: `reason` says why, without the path."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{shown_path(path)}: {reason}")


def read_regular_file(path: Path, limit: int, what: str) -> bytes:
    """The bytes of `path`, a regular file (or a link to one) of at most `limit` bytes, else FileRefusedError.

    Judged before anything is read: a FIFO waits for a writer forever, /dev/zero never ends, and opening some
    devices does something. Opened without blocking and judged again by the descriptor: the path may change.
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise FileRefusedError(path, f"is not a regular file (a FIFO, device or directory?): give the {what}")
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(descriptor, "rb") as file:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise FileRefusedError(path, f"is not a regular file (a FIFO, device or directory?): give the {what}")
            data = file.read(limit + 1)
    except OSError as error:
        raise FileRefusedError(path, f"cannot read {what}: {error.strerror or error}") from None
    if len(data) > limit:
        raise FileRefusedError(path, f"larger than {limit // 1024} KiB: not a {what}")
    return data


@contextlib.contextmanager
def captured_log(level: int) -> Iterator[list[logging.LogRecord]]:
    """The root logger's records of at least `level` while the block runs, kept instead of printed: libraries
    that report through `logging` (Pulumi's mock engine, the kubernetes client's exec plugin) would print them
    bare (`ERROR:root:...`), and the tool says them once, in its own words."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(level)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield records
    finally:
        root.removeHandler(handler)


def can_print(text: str) -> bool:
    """Whether stdout's encoding has these characters (a C locale or PYTHONIOENCODING=ascii may not)."""
    try:
        text.encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def shown_path(path: Path) -> str:
    """A path as the user would type it: relative to the current directory where it lies under it (as the
    README shows `stacks/Pulumi.prod.yaml`), else as given."""
    try:
        return str(Path(path).absolute().relative_to(Path.cwd()))
    except (ValueError, OSError):  # elsewhere, or no current directory any more
        return str(path)


def add_stack_source(arguments: argparse.ArgumentParser, *, required: bool = True) -> None:
    """--stack NAME (stacks/Pulumi.<NAME>.yaml) or --stack-file PATH: how every tool names a stack."""
    source = arguments.add_mutually_exclusive_group(required=required)
    source.add_argument("--stack", help="stack name: reads stacks/Pulumi.<stack>.yaml")
    source.add_argument("--stack-file", type=Path, help="any Pulumi stack file")


def stack_files(stacks_dir: Path = STACKS_DIR) -> list[Path]:
    """The stack files of a stackConfigDir: the one list of this project's stacks (a new one is its file)."""
    return sorted(stacks_dir.glob(STACK_FILE_GLOB))


def stack_file(args: argparse.Namespace, stacks_dir: Path = STACKS_DIR) -> Path:
    """The stack file --stack or --stack-file names; where `pulumi stack select` looks for --stack."""
    if args.stack_file is not None:
        return Path(args.stack_file)
    path = stacks_dir / f"Pulumi.{args.stack}.yaml"
    if not path.is_file():
        known = ", ".join(stack_name_of(p) for p in stack_files(stacks_dir))
        raise UsageError(f"--stack {args.stack}: no stack file {path.name} in {stacks_dir.name}/ (stacks: {known})")
    return Path(shown_path(path))  # what every message about it then names


def stack_name_of(path: Path) -> str:
    """The stack a file configures: Pulumi.<stack>.yaml, else the file's stem."""
    name = path.name
    if name.startswith("Pulumi.") and name.endswith((".yaml", ".yml")):
        return name[len("Pulumi.") :].rsplit(".", 1)[0]
    return path.stem


def format_table(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Left-aligned columns two spaces apart, the first row being the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


@contextlib.contextmanager
def interrupt_ends_process() -> Iterator[None]:
    """Around work that writes nothing and whose KeyboardInterrupt cannot be trusted to leave: a tool's Ctrl-C
    ends the process at once, as killed by SIGINT. Pulumi's event loop, which runs the program under the mocks,
    swallows an interrupt that lands in some of its callbacks (the render then goes on) or waits forever on the
    task it ended (a hang). Only in a tool's own process and main thread: tests and other programs keep theirs."""
    if not TOOL_PROCESS or threading.current_thread() is not threading.main_thread():
        yield
        return

    def end(_signum: int, _frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, end)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
