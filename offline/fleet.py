"""Check every stack file together: python -m offline.fleet [--stacks-dir stacks] [--list [--only STACK]]

A GPU UUID in at most one stack, a node of one cluster in at most one stack (stack_config/fleet.py
says why). Exit 1 naming each conflict, 2 when a stack file is invalid. With --list, and no conflict:
the stacks as a JSON list in rollout order (`hidden-gpu:rolloutWave`, then name), which the workflows
run over; --only narrows it to one stack, refusing a name no file has.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from common.cli import (
    EXIT_FINDING,
    EXIT_OK,
    STACK_FILE_GLOB,
    STACKS_DIR,
    UsageError,
    parser,
    run,
    shown_path,
    stack_files,
)
from stack_config.fleet import conflicts, rollout_order


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python -m offline.fleet", __doc__)
    arguments.add_argument("--stacks-dir", type=Path, default=STACKS_DIR, help="default: the project's stacks/")
    arguments.add_argument("--list", action="store_true", help="print the stacks as JSON, in rollout order")
    arguments.add_argument("--only", help="with --list: only this stack")
    args = arguments.parse_args(argv)

    def command() -> int:
        # A safety check that read nothing must not pass: a mistyped or empty --stacks-dir is refused.
        if not args.stacks_dir.is_dir():
            what = "is not a directory" if args.stacks_dir.exists() else "does not exist"
            raise UsageError(f"--stacks-dir {shown_path(args.stacks_dir)}: {what}; give the stacks' directory")
        files = stack_files(args.stacks_dir)
        if not files:
            raise UsageError(f"--stacks-dir {shown_path(args.stacks_dir)}: no {STACK_FILE_GLOB} file: nothing to check")
        found = conflicts(files)
        for conflict in found:
            print(f"conflict: {conflict}", file=sys.stderr if args.list else sys.stdout)
        if not args.list:
            print(f"{len(files)} stack files, {len(found)} conflict(s)")
        if found or not args.list:
            return EXIT_FINDING if found else EXIT_OK
        names = rollout_order(files)
        if args.only:
            if args.only not in names:
                raise UsageError(
                    f"--only {args.only}: no stack file Pulumi.{args.only}.yaml (stacks: {', '.join(names)})"
                )
            names = [args.only]
        print(json.dumps(names))
        return EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
