"""Render destroys nothing it did not write (issue 15; issue 21, item 7): it refuses the stacks directory, a working or
home directory, a copied or hard-linked render and a render holding a file it did not write (its own stack file too),
and leaves each as it was; an interrupted render leaves the previous output; a moved render is still its own. Each test
here failed on the code before the change that introduced it (see its commit)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from common.cli import EXIT_USAGE
from offline import render
from tests.support.stacks import valid_config, write_stack

ROOT = Path(__file__).resolve().parent.parent


# --- 1. Writes that cannot destroy ---


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_render_into_stacks_refuses_and_deletes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(ROOT / "stacks")
    assert render.main(["--stack", "prod", "--out", str(ROOT / "stacks")]) == EXIT_USAGE
    assert snapshot(ROOT / "stacks") == before
    assert "was not written by hidden-gpu" in capsys.readouterr().err


@pytest.mark.parametrize("out", [".", "home"])
def test_render_into_a_working_or_home_directory_refuses(
    out: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("export KEEP=1\n")
    (home / "notes.yaml").write_text("mine: true\n")
    monkeypatch.chdir(home)
    stack_file = write_stack(tmp_path, valid_config())
    before = snapshot(home)
    assert render.main(["--stack-file", str(stack_file), "--out", out if out == "." else str(home)]) == EXIT_USAGE
    assert snapshot(home) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Pulumi.case.yaml", "home"]  # no staging left


def test_an_interrupted_render_leaves_the_previous_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    stack_file = write_stack(tmp_path, valid_config())
    assert render.main(["--stack-file", str(stack_file), "--out", str(out)]) == 0
    before = snapshot(out)

    def interrupted(obj: dict[str, Any]) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(render, "to_yaml", interrupted)
    assert render.main(["--stack-file", str(stack_file), "--out", str(out)]) == 130
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Pulumi.case.yaml", "out"]


# --- Render writes only into a directory it can prove it wrote (issue 21, item 7) ---


def rendered_once(tmp_path: Path) -> tuple[Path, Path]:
    stack_file = write_stack(tmp_path, valid_config())
    out = tmp_path / "render"
    assert render.main(["--stack-file", str(stack_file), "--out", str(out)]) == 0
    return stack_file, out


def test_a_copied_render_with_a_users_files_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`cp -a render/prod/. dir/` copies the marker too: it names the directory it was written for."""
    stack_file, out = rendered_once(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.md").write_text("mine\n")
    subprocess.run(["cp", "-a", f"{out}/.", str(mine)], check=True)
    before = snapshot(mine)
    assert render.main(["--stack-file", str(stack_file), "--out", str(mine)]) == EXIT_USAGE
    assert snapshot(mine) == before
    assert "was written for another directory (copied here?)" in capsys.readouterr().err


def test_a_linked_marker_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stack_file, out = rendered_once(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.md").write_text("mine\n")
    (mine / ".hidden-gpu-output").hardlink_to(out / ".hidden-gpu-output")
    assert render.main(["--stack-file", str(stack_file), "--out", str(mine)]) == EXIT_USAGE
    assert (mine / "notes.md").exists() and "is a link, not the one hidden-gpu wrote" in capsys.readouterr().err


def test_a_file_added_to_a_render_is_never_deleted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stack_file, out = rendered_once(tmp_path)
    (out / "review-notes.md").write_text("mine\n")
    assert render.main(["--stack-file", str(stack_file), "--out", str(out)]) == EXIT_USAGE
    assert (out / "review-notes.md").exists()
    assert "holds files hidden-gpu did not write: review-notes.md" in capsys.readouterr().err


def test_render_never_deletes_its_own_stack_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out = rendered_once(tmp_path)
    inside = write_stack(out, valid_config())
    assert render.main(["--stack-file", str(inside), "--out", str(out)]) == EXIT_USAGE
    assert inside.exists() and "holds files hidden-gpu did not write: Pulumi.case.yaml" in capsys.readouterr().err


def test_a_moved_render_is_still_ours(tmp_path: Path) -> None:
    stack_file, out = rendered_once(tmp_path)
    moved = out.rename(tmp_path / "moved")
    assert render.main(["--stack-file", str(stack_file), "--out", str(moved)]) == 0
