"""`pulumi up --yes` for tests/real/test_quickstart.py, which puts this behind `pulumi` on the README's PATH: the
program is this checkout's __main__.py, run inline through the Automation API (the CLI's Python language host,
which `pulumi up` would start, is not served by the module proxy), on the stack `pulumi stack init` selected, in
the backend `pulumi login` chose, with the CLI's own environment. Everything else the README runs is the real
CLI's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pulumi import automation as auto

from common.names import PROJECT
from tests.real import harness


def main(argv: list[str]) -> int:
    if argv != ["--yes"]:
        print(f"quickstart_up: only `pulumi up --yes` stands in here, not {argv}", file=sys.stderr)
        return 2
    work = Path.cwd()
    summary = auto.LocalWorkspace(work_dir=str(work)).stack()
    if summary is None:
        print("quickstart_up: no stack selected (pulumi stack init first)", file=sys.stderr)
        return 2
    harness.STACK_FILES[summary.name] = work / "stacks" / f"Pulumi.{summary.name}.yaml"
    options = auto.LocalWorkspaceOptions(work_dir=str(work), env_vars=dict(os.environ))
    stack = auto.select_stack(summary.name, project_name=PROJECT, program=harness.program, opts=options)
    stack.up(on_output=print)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
