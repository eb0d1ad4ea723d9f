"""What every command-line tool here shares: the usage error, the error lines, the tables.

Standard library only: the GPU-host tools import it too.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

# Exit statuses, the same for every tool.
EXIT_OK = 0
EXIT_FINDING = 1  # the check ran and found a mismatch or a violation
EXIT_USAGE = 2  # bad arguments, an invalid stack file, an unusable directory or kubeconfig
EXIT_UNAVAILABLE = 3  # what the tool reads cannot answer: NVML on a GPU host, the API server for verify


class UsageError(Exception):
    """Bad arguments, an unusable output directory or stack file: EXIT_USAGE."""


def print_errors(message: str) -> None:
    """One `error:` line on stderr per line of the message; never a traceback."""
    for line in message.splitlines():
        print(f"error: {line}", file=sys.stderr)


def format_table(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Left-aligned columns two spaces apart, the first row being the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )
