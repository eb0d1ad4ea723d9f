"""Check every stack file together: python -m offline.fleet [--stacks-dir stacks]

A GPU UUID in at most one stack, a node of one cluster in at most one stack (stack_config/fleet.py
says why). Exit 1 naming each conflict, 2 when a stack file is invalid.
"""

from __future__ import annotations

import sys
from pathlib import Path

from common.cli import EXIT_FINDING, EXIT_OK, STACKS_DIR, parser, run
from stack_config.fleet import conflicts, stack_files


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python -m offline.fleet", __doc__)
    arguments.add_argument("--stacks-dir", type=Path, default=STACKS_DIR, help="default: the project's stacks/")
    args = arguments.parse_args(argv)

    def command() -> int:
        files = stack_files(args.stacks_dir)
        found = conflicts(files)
        for conflict in found:
            print(f"conflict: {conflict}")
        print(f"{len(files)} stack files, {len(found)} conflict(s)")
        return EXIT_FINDING if found else EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
