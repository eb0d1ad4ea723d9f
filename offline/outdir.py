"""Output directories the tools own: written whole or not at all, and never one they did not write.

A directory is ours when it carries MARKER, which only replace_directory writes. Anything else
that exists (a checkout, stacks/, a home directory) is refused, so no mistyped --out can delete
what a person wrote. The new content is written beside the old and swapped in by renames, so an
interrupted run leaves the previous output as it was.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from common.cli import UsageError

MARKER = ".hidden-gpu-output"
MARKER_TEXT = "Written by hidden-gpu; replaced whole on every run. Do not put other files here.\n"


def check_ours(out_dir: Path) -> None:
    """Refuse an --out that exists and is not an empty directory or one of our outputs."""
    if out_dir.is_symlink():
        raise UsageError(f"--out {out_dir}: is a symbolic link; give the directory itself")
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: exists and is not a directory; choose another")
    if not (out_dir / MARKER).is_file() and any(out_dir.iterdir()):
        raise UsageError(
            f"--out {out_dir}: exists and was not written by hidden-gpu (no {MARKER}); "
            "nothing was changed: choose a new or empty directory"
        )


def replace_directory(out_dir: Path, files: dict[str, str]) -> None:
    """Make out_dir hold exactly `files` (name -> text) and the marker, or leave it untouched."""
    check_ours(out_dir)
    for name in files:
        if "/" in name or name in ("", ".", "..", MARKER):
            raise ValueError(f"not a plain file name: {name!r}")
    parent = out_dir.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.new-", dir=parent))
    try:
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        (staging / MARKER).write_text(MARKER_TEXT, encoding="utf-8")
        if not out_dir.exists():
            staging.rename(out_dir)
            return
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=parent))
        old.rmdir()
        out_dir.rename(old)
        try:
            staging.rename(out_dir)
        except BaseException:
            old.rename(out_dir)
            raise
        shutil.rmtree(old)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)
        raise
