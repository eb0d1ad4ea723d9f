"""offline.salts, the pull request's check that a new stack file carries what `pulumi stack init` wrote (issue 32,
4): without it the first runner to use the stack would make a salt nobody commits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from common.cli import EXIT_FINDING, EXIT_OK, EXIT_USAGE
from offline import salts
from tests.support.stacks import valid_config, write_stack

SALT = "encryptionsalt: v1:Zm9vYmFyYmF6:v1:cXV4cXV4cXV4:c2FsdHNhbHRzYWx0c2FsdA=="
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]


def repository(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose base commit has stacks/Pulumi.dev.yaml with its salt."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    stack(stacks, "dev", SALT)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*GIT, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*GIT, "commit", "-qm", "base"], cwd=tmp_path, check=True)
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True, check=True)
    return stacks, base.stdout.strip()


def stack(stacks: Path, name: str, *top: str) -> Path:
    path = write_stack(stacks, valid_config(), name)
    path.write_text("\n".join(top) + ("\n" if top else "") + path.read_text())
    return path


def check(stacks: Path, base: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = salts.main([f"--base={base}", "--stacks-dir", str(stacks)])
    out, err = capsys.readouterr()
    return status, out, err


def test_a_new_stack_without_its_salt_fails_saying_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stacks, base = repository(tmp_path)
    stack(stacks, "staging")
    status, _, err = check(stacks, base, capsys)
    assert status == EXIT_FINDING and err.count("\n") == 1, err
    assert "Pulumi.staging.yaml: a new stack without encryptionsalt: create it with " in err
    assert "`pulumi stack init staging --secrets-provider passphrase`" in err
    assert "commit that file in this pull request" in err


def test_a_new_stack_with_its_salt_or_its_kms_key_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stacks, base = repository(tmp_path)
    stack(stacks, "staging", SALT)
    stack(stacks, "lab", "secretsprovider: awskms://alias/hidden-gpu", "encryptedkey: AQICAHh=")
    status, out, err = check(stacks, base, capsys)
    assert (status, err) == (EXIT_OK, "")
    assert out == "3 stack files, 2 new; each keeps the secrets keys it was created with\n"


def test_a_kms_stack_without_its_encrypted_key_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stacks, base = repository(tmp_path)
    stack(stacks, "lab", "secretsprovider: awskms://alias/hidden-gpu")
    status, _, err = check(stacks, base, capsys)
    assert status == EXIT_FINDING and "Pulumi.lab.yaml: a new stack without encryptedkey" in err


def test_the_first_salt_of_a_stack_committed_without_one_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 42, 1: the shipped stacks/Pulumi.{dev,prod}.yaml have no salt; the README's first
    `pulumi stack select --create` writes one, and committing it was refused as a changed salt."""
    stacks, _ = repository(tmp_path)
    stack(stacks, "prod")
    subprocess.run([*GIT, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*GIT, "commit", "-qm", "prod without a salt"], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True, check=True)
    stack(stacks, "prod", SALT)
    status, _, err = check(stacks, head.stdout.strip(), capsys)
    assert (status, err) == (EXIT_OK, "")
    stack(stacks, "prod", "secretsprovider: awskms://alias/hidden-gpu")  # but it must be whole
    status, _, err = check(stacks, head.stdout.strip(), capsys)
    assert status == EXIT_FINDING and "Pulumi.prod.yaml: a new stack without encryptedkey" in err


def test_a_changed_or_dropped_salt_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stacks, base = repository(tmp_path)
    stack(stacks, "dev")
    status, _, err = check(stacks, base, capsys)
    assert status == EXIT_FINDING and "Pulumi.dev.yaml: encryptionsalt changed" in err
    stack(stacks, "dev", SALT.replace("Zm9v", "YmFy"))
    assert check(stacks, base, capsys)[0] == EXIT_FINDING


@pytest.mark.parametrize("base", ["no-such-commit", "--output=x", ""])
def test_a_base_that_is_not_a_commit_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], base: str) -> None:
    stacks, _ = repository(tmp_path)
    status, _, err = check(stacks, base, capsys)
    assert status == EXIT_USAGE and err.startswith("error: ") and err.count("\n") == 1, err


def test_an_invalid_stack_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stacks, base = repository(tmp_path)
    (stacks / "Pulumi.broken.yaml").write_text("config: [\n")
    status, _, err = check(stacks, base, capsys)
    assert status == EXIT_USAGE and "Pulumi.broken.yaml" in err and err.count("\n") == 1, err


def test_the_pull_request_runs_it_against_its_base() -> None:
    import yaml  # noqa: PLC0415

    workflow = yaml.safe_load((Path(__file__).resolve().parent.parent / ".github/workflows/preview.yml").read_text())
    steps = workflow["jobs"]["test-and-render-diff"]["steps"]
    (step,) = [s for s in steps if "offline.salts" in str(s.get("run"))]
    assert step["run"] == '.venv/bin/python -m offline.salts --base "$BASE_SHA"'
    assert step["env"]["BASE_SHA"] == "${{ github.event.pull_request.base.sha }}"
