"""Release tags a platform can pin: a semver tag `vX.Y.Z` on a commit whose version (pyproject.toml, which the component
package reports too) is X.Y.Z and whose CHANGELOG.md has that version's section.

    python -m offline.release_tag check   # the tree's version and every vX.Y.Z tag agree with CHANGELOG.md
    python -m offline.release_tag tag     # tag HEAD vX.Y.Z (annotated: the section's first lines), after the checks

Consumers pin a tag: `pulumi package add <git repository>/package@vX.Y.Z` (docs/operations.md). `tag` refuses a
tree with changes (the tag would not name what was checked), a version without its dated section, a version still
under "Unreleased", and a tag that exists. It does not push.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from common.cli import EXIT_FINDING, EXIT_OK, UsageError, parser, run

ROOT = Path(__file__).resolve().parent.parent
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")
# A released version's heading: `## 0.2.0 (2026-12-06)`.
SECTION = re.compile(r"^## (\S+) \((\d{4}-\d{2}-\d{2})\)$", re.MULTILINE)


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise UsageError(f"git {' '.join(args)} in {root}: {done.stderr.strip() or 'failed'}")
    return done.stdout


def version_of(pyproject: str, where: str) -> str:
    try:
        version = str(tomllib.loads(pyproject)["project"]["version"])
    except (tomllib.TOMLDecodeError, KeyError) as error:
        raise UsageError(f"{where}: no project.version ({error})") from None
    if not SEMVER.fullmatch(version):
        raise UsageError(f"{where}: project.version {version!r} is not X.Y.Z")
    return version


def sections(changelog: str) -> dict[str, str]:
    """Each released version's section of a CHANGELOG: version -> its text, heading included."""
    found = list(SECTION.finditer(changelog))
    ends = [m.start() for m in found[1:]] + [len(changelog)]
    return {m.group(1): changelog[m.start() : end].strip() for m, end in zip(found, ends, strict=True)}


def problems(root: Path) -> list[str]:
    """What keeps the tree's version, and every version tag, from agreeing with the CHANGELOG; [] when they do."""
    version = version_of((root / "pyproject.toml").read_text(encoding="utf-8"), "pyproject.toml")
    changelog = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    found = []
    if version not in sections(changelog):
        found.append(f"CHANGELOG.md: no section `## {version} (YYYY-MM-DD)` for pyproject.toml's version {version}")
    for tag in git(root, "tag", "--list", "v*").split():
        if not SEMVER.fullmatch(tag[1:]):
            continue
        tagged = version_of(git(root, "show", f"{tag}:pyproject.toml"), f"{tag}:pyproject.toml")
        if tagged != tag[1:]:
            found.append(f"tag {tag}: its pyproject.toml says {tagged}")
        if tag[1:] not in sections(git(root, "show", f"{tag}:CHANGELOG.md")):
            found.append(f"tag {tag}: its CHANGELOG.md has no section for {tag[1:]}")
    return found


def tag(root: Path) -> str:
    """Tag HEAD with the tree's version; the tag's name."""
    if found := problems(root):
        raise UsageError("; ".join(found))
    if changed := git(root, "status", "--porcelain").strip():
        first = changed.splitlines()[0]
        raise UsageError(f"the tree has changes ({first} ...): commit them first, so the tag names what was checked")
    version = version_of((root / "pyproject.toml").read_text(encoding="utf-8"), "pyproject.toml")
    name = f"v{version}"
    if git(root, "tag", "--list", name).strip():
        raise UsageError(f"tag {name} exists: raise project.version in pyproject.toml and add its CHANGELOG section")
    section = sections((root / "CHANGELOG.md").read_text(encoding="utf-8"))[version]
    git(root, "tag", "--annotate", "--cleanup=verbatim", name, "--message", f"hidden-gpu {version}\n\n{section[:4000]}")
    return name


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    arguments = parser("python -m offline.release_tag", __doc__)
    arguments.add_argument("action", choices=("check", "tag"))
    args = arguments.parse_args(argv)

    def command() -> int:
        if args.action == "tag":
            name = tag(root)
            print(f"tagged {name}; push it: git push origin {name}")
            return EXIT_OK
        found = problems(root)
        for problem in found:
            print(problem, file=sys.stderr)
        return EXIT_FINDING if found else EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
