"""Output directories the tools own: written whole or not at all, and never one they did not write.

A directory is ours only when it proves it: its MARKER, a plain file with one link, records the
directory's own identity (device and inode, which a copy or another directory does not share) and
the name of every file the tool wrote there, and the directory holds nothing else. So a mistyped
--out, a directory someone copied a render into (`cp -a render/prod/. dir/`, which copies the marker
too), or one that gained a file by hand is refused and nothing in it is deleted. The new content is
written beside the old and swapped in by renames (which keep the inode), so an interrupted run leaves
the previous output as it was.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from common.cli import UsageError, bounded

MARKER = ".hidden-gpu-output"
MARKER_NOTE = "Written by hidden-gpu; replaced whole on every run. Do not put other files here."


def _refuse(out_dir: Path, why: str) -> UsageError:
    return UsageError(f"--out {out_dir}: {why}; nothing was changed: choose a new or empty directory")


def _marker(out_dir: Path) -> dict[str, Any]:
    """The marker's record, or UsageError when it is missing, not a plain file of its own, or unreadable."""
    path = out_dir / MARKER
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise _refuse(out_dir, f"exists and was not written by hidden-gpu (no {MARKER})") from None
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        raise _refuse(out_dir, f"its {MARKER} is a link, not the one hidden-gpu wrote there")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("files"), list):
        raise _refuse(out_dir, f"its {MARKER} is not one this hidden-gpu wrote (an older one's, or edited)")
    return record


def check_ours(out_dir: Path, keep: Iterable[Path] = ()) -> None:
    """Refuse an --out that exists and is neither an empty directory nor provably our output, or that
    holds a file the run needs (its own stack file)."""
    if out_dir.is_symlink():
        raise UsageError(f"--out {out_dir}: is a symbolic link; give the directory itself")
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: exists and is not a directory; choose another")
    entries = list(out_dir.iterdir())
    if not entries:
        return
    record = _marker(out_dir)
    here = out_dir.stat()
    if record.get("directory") != {"device": here.st_dev, "inode": here.st_ino}:
        raise _refuse(out_dir, f"its {MARKER} was written for another directory (copied here?)")
    written = set(record["files"]) | {MARKER}
    foreign = sorted(p.name for p in entries if p.name not in written or not stat.S_ISREG(p.lstat().st_mode))
    if foreign:
        raise _refuse(out_dir, f"holds files hidden-gpu did not write: {bounded(', '.join(foreign))}")
    for path in keep:  # listed as written (a marker edited to say so): still never delete the input
        if path.resolve().is_relative_to(out_dir.resolve()):
            raise _refuse(out_dir, f"holds {path}, which this run reads")


def replace_directory(out_dir: Path, files: dict[str, str], keep: Iterable[Path] = ()) -> None:
    """Make out_dir hold exactly `files` (name -> text) and the marker, or leave it untouched."""
    keep = list(keep)
    check_ours(out_dir, keep)
    for name in files:
        if "/" in name or name in ("", ".", "..", MARKER):
            raise ValueError(f"not a plain file name: {name!r}")
    parent = out_dir.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.new-", dir=parent))
    try:
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        here = staging.stat()  # the rename below keeps it: the marker names the directory it ends up as
        record = {
            "note": MARKER_NOTE,
            "directory": {"device": here.st_dev, "inode": here.st_ino},
            "files": sorted(files),
        }
        (staging / MARKER).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        if not out_dir.exists():
            staging.rename(out_dir)
            return
        check_ours(out_dir, keep)  # again, just before anything is moved: it may have changed meanwhile
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
