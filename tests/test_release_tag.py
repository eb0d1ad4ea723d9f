"""offline.release_tag: a tag names a commit whose version and CHANGELOG section agree, in a git repository made here,
and the project's own tree and tags agree today."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from offline import release_tag as release

CHANGELOG = "# Changelog\n\n## Unreleased\n\n- later\n\n## 0.1.0 (2026-12-05)\n\n- first\n"


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{key}_NAME", "release test")
        monkeypatch.setenv(f"GIT_{key}_EMAIL", "release@test.invalid")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    write(tmp_path, "0.1.0", CHANGELOG)
    return tmp_path


def write(root: Path, version: str, changelog: str, commit: bool = True) -> None:
    (root / "pyproject.toml").write_text(f'[project]\nname = "x"\nversion = "{version}"\n')
    (root / "CHANGELOG.md").write_text(changelog)
    if commit:
        subprocess.run(["git", "add", "-A"], cwd=root, check=True)
        subprocess.run(["git", "commit", "-qm", version], cwd=root, check=True)


def test_the_projects_version_and_tags_agree_with_its_changelog() -> None:
    assert release.problems(release.ROOT) == []


def test_a_tag_names_the_checked_commit(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert release.main(["tag"], root=repo) == 0
    assert "tagged v0.1.0; push it: git push origin v0.1.0" in capsys.readouterr().out
    message = release.git(repo, "tag", "--list", "--format=%(contents)", "v0.1.0")
    assert message.startswith("hidden-gpu 0.1.0\n\n## 0.1.0 (2026-12-05)") and "- first" in message
    assert "later" not in message  # the version's own section, not Unreleased
    assert release.main(["check"], root=repo) == 0


@pytest.mark.parametrize(
    ("version", "dirty", "said"),
    [
        ("0.2.0", False, "CHANGELOG.md: no section `## 0.2.0 (YYYY-MM-DD)` for pyproject.toml's version"),
        ("0.2", False, "pyproject.toml: project.version '0.2' is not X.Y.Z"),
        ("0.1.0", True, "the tree has changes (M CHANGELOG.md ...): commit them first"),
    ],
    ids=["unreleased-version", "not-semver", "changes"],
)
def test_a_tag_is_refused_with_the_reason(
    repo: Path, capsys: pytest.CaptureFixture[str], version: str, dirty: bool, said: str
) -> None:
    write(repo, version, CHANGELOG + ("\n" if dirty else ""), commit=not dirty)
    assert release.main(["tag"], root=repo) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.splitlines()) == 1, err
    assert release.git(repo, "tag", "--list").strip() == ""


def test_an_existing_tag_is_refused_and_a_tag_that_disagrees_is_found(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert release.main(["tag"], root=repo) == 0
    assert release.main(["tag"], root=repo) == 2
    assert "tag v0.1.0 exists: raise project.version" in capsys.readouterr().err
    release.git(repo, "tag", "v0.3.0")  # by hand, on a commit that says 0.1.0
    assert release.main(["check"], root=repo) == 1
    assert "tag v0.3.0: its pyproject.toml says 0.1.0" in capsys.readouterr().err
