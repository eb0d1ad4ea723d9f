"""A pull request's stack files keep their secrets readable: python -m offline.salts --base SHA [--stacks-dir stacks]

A stack's secrets (its passphrase, or its KMS key) are bound to what `pulumi stack init` writes into its stack
file: `encryptionsalt` for a passphrase, `secretsprovider` and `encryptedkey` for a KMS key. A stack file that
arrives without them was never created, or created on someone's machine and committed without them: the first
`pulumi up` on a runner would make its own, which nobody commits, and the next run could not read the stack's
secrets. The workflows never create a stack (README). So, against the pull request's base commit:
- a stack file the base does not have must carry them;
- a stack file the base has must keep them as they are (a changed salt is a new key for the same secrets).
Exit 1 naming each file and what to do, 2 on a bad argument or an unreadable stack file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from common.cli import (
    EXIT_FINDING,
    EXIT_OK,
    STACK_FILE_GLOB,
    STACKS_DIR,
    UsageError,
    bounded,
    parser,
    run,
    shown_path,
    stack_files,
    stack_name_of,
)
from stack_config import read_stack_file

# What `pulumi stack init --secrets-provider ...` writes beside `config:`, by provider.
PASSPHRASE_KEYS = ("encryptionsalt",)
KMS_KEYS = ("secretsprovider", "encryptedkey")


def secrets_keys(document: Any) -> dict[str, str]:
    """The keys that bind a stack's secrets, as the file has them."""
    if not isinstance(document, dict):
        return {}
    return {key: str(document[key]) for key in (*PASSPHRASE_KEYS, *KMS_KEYS) if document.get(key) not in (None, "")}


def missing_keys(found: dict[str, str]) -> list[str]:
    """What the file lacks: a KMS stack needs both of its keys, any other a salt."""
    if "secretsprovider" in found:
        return [key for key in KMS_KEYS if key not in found]
    return [key for key in PASSPHRASE_KEYS if key not in found]


def _git(*args: str, cwd: Path) -> str:
    try:
        result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise UsageError(f"git {' '.join(args[:2])}: {bounded(str(error), 200)}") from None
    if result.returncode != 0:
        said = (result.stderr.strip().splitlines() or ["failed"])[-1]
        raise UsageError(f"git {' '.join(args[:2])}: {bounded(said, 200)}")
    return result.stdout


def base_documents(base: str, stacks_dir: Path) -> dict[str, Any]:
    """Each stack file of the base commit (by file name) as YAML, in the same directory of the repository."""
    if not base or base.startswith("-"):
        raise UsageError(f"--base {bounded(base)}: not a commit")
    top = Path(_git("rev-parse", "--show-toplevel", cwd=stacks_dir).strip())
    _git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}", cwd=stacks_dir)
    where = stacks_dir.resolve().relative_to(top.resolve()).as_posix()
    # From the top: ls-tree lists only what lies under the directory it runs in.
    listed = _git("ls-tree", "--name-only", f"{base}:{where}" if where != "." else base, cwd=top)
    documents = {}
    for name in listed.splitlines():
        if Path(name).match(STACK_FILE_GLOB):
            text = _git("show", f"{base}:{where}/{name}" if where != "." else f"{base}:{name}", cwd=top)
            try:
                documents[name] = yaml.safe_load(text)
            except yaml.YAMLError:  # the base's file was broken: this change is judged as if it were new
                documents[name] = None
    return documents


def problems(path: Path, base: dict[str, Any]) -> list[str]:
    read_stack_file(path)  # refuses what no stack file may be (a FIFO, a bomb, a broken file), in one line
    found = secrets_keys(yaml.safe_load(path.read_text(encoding="utf-8")))
    stack, shown = stack_name_of(path), shown_path(path)
    init = (
        f"`pulumi stack init {stack} --secrets-provider passphrase` (or awskms://..., hashivault://...), which "
        f"writes them into {shown}, and commit that file in this pull request"
    )
    before = secrets_keys(base[path.name]) if path.name in base else {}
    # A new file, or one committed without secrets keys (the shipped dev and prod stacks are): its first
    # `pulumi stack init`/`select --create` writes them, nothing was encrypted before, and they must be whole.
    if not before:
        lacking = missing_keys(found)
        if lacking and (path.name not in base or found):
            return [f"{shown}: a new stack without {' and '.join(lacking)}: create it with {init}"]
        return []
    changed = sorted(key for key in set(before) | set(found) if before.get(key) != found.get(key))
    if changed:
        return [
            f"{shown}: {', '.join(changed)} changed: the stack's secrets were encrypted under the old "
            f"ones; keep them (or change the provider with `pulumi stack change-secrets-provider`, committing "
            f"what it writes)"
        ]
    return []


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python -m offline.salts", __doc__)
    arguments.add_argument("--base", required=True, help="the pull request's base commit")
    arguments.add_argument("--stacks-dir", type=Path, default=STACKS_DIR, help="default: the project's stacks/")
    args = arguments.parse_args(argv)

    def command() -> int:
        if not args.stacks_dir.is_dir():
            raise UsageError(f"--stacks-dir {shown_path(args.stacks_dir)}: not a directory")
        files = stack_files(args.stacks_dir)
        if not files:
            raise UsageError(f"--stacks-dir {shown_path(args.stacks_dir)}: no {STACK_FILE_GLOB} file: nothing to check")
        base = base_documents(args.base, args.stacks_dir)
        found = [problem for path in files for problem in problems(path, base)]
        for problem in found:
            print(f"error: {problem}", file=sys.stderr)
        if not found:
            new = [p.name for p in files if p.name not in base]
            print(f"{len(files)} stack files, {len(new)} new; each keeps the secrets keys it was created with")
        return EXIT_FINDING if found else EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
