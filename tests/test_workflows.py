"""The GitHub workflows: schema-valid (as `make lint` checks them) and wired as documented."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from offline import fleet

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


def validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    command = [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.github-workflows", *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def load(name: str) -> dict[Any, Any]:
    workflow: dict[Any, Any] = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    return workflow


def test_the_workflows_are_schema_valid() -> None:
    assert [p.name for p in WORKFLOWS] == ["preview.yml", "up-stack.yml", "up.yml"]
    result = validate(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("broken", "why"),
    [
        (lambda w: w["jobs"]["pulumi-preview"].pop("runs-on"), "a job without runs-on"),
        (lambda w: w["jobs"]["pulumi-preview"].__setitem__("runs_on", "ubuntu-latest"), "a misspelt key"),
        (lambda w: w["jobs"]["test-and-render-diff"]["steps"][0].__setitem__("uses", 42), "a step's uses not a string"),
    ],
    ids=["missing-runs-on", "misspelt-key", "wrong-type"],
)
def test_a_broken_workflow_fails_the_check(tmp_path: Path, broken: Any, why: str) -> None:
    workflow = load("preview.yml")
    broken(workflow)
    path = tmp_path / "preview.yml"
    path.write_text(yaml.safe_dump(workflow, sort_keys=False))
    assert validate(path).returncode != 0, why


def pulumi_steps(workflow: dict[Any, Any], job: str) -> list[dict[str, Any]]:
    return [s for s in workflow["jobs"][job]["steps"] if str(s.get("uses", "")).startswith("pulumi/actions@")]


def test_preview_runs_tests_comments_the_render_diff_and_previews_every_stack() -> None:
    workflow = load("preview.yml")
    assert list(workflow[True]) == ["pull_request"]  # YAML reads the key `on` as True
    render_job = workflow["jobs"]["test-and-render-diff"]
    assert {"run": "make test"} in render_job["steps"]
    listing = next(s for s in render_job["steps"] if s.get("id") == "stacks")
    assert "python -m offline.fleet --list" in listing["run"]  # the conflicts checked, the stacks listed
    assert any("scripts/render_diff.sh" in str(s.get("run", "")) for s in render_job["steps"])
    preview = workflow["jobs"]["pulumi-preview"]
    assert preview["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.test-and-render-diff.outputs.stacks) }}"
    (step,) = pulumi_steps(workflow, "pulumi-preview")
    assert step["with"]["command"] == "preview" and step["with"]["comment-on-pr"] is True
    assert step["with"]["cloud-url"] == "${{ secrets.PULUMI_BACKEND_URL }}"
    assert step["env"]["KUBECONFIG"] == "${{ runner.temp }}/kubeconfig"
    assert step["with"]["policyPacks"] == "policy"


def pulumi_step_sets() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(job, pulumi step) for every job that runs Pulumi."""
    preview, up = load("preview.yml"), load("up-stack.yml")
    return [
        (preview["jobs"]["pulumi-preview"], pulumi_steps(preview, "pulumi-preview")[0]),
        (up["jobs"]["up"], pulumi_steps(up, "up")[0]),
    ]


def test_stacks_are_created_when_missing_with_the_pinned_cli() -> None:
    version = (ROOT / ".pulumi-version").read_text().strip()
    pinned = next(line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("pulumi=="))
    assert pinned == f"pulumi=={version}"  # the CLI and the SDK move together
    for _, step in pulumi_step_sets():
        assert step["uses"] == "pulumi/actions@v7"
        assert step["with"]["upsert"] is True and step["with"]["secrets-provider"] == "passphrase"
        assert step["with"]["pulumi-version-file"] == ".pulumi-version"


def test_every_pulumi_job_runs_in_its_stacks_environment_with_a_timeout() -> None:
    preview, up = (job for job, _ in pulumi_step_sets())
    assert preview["environment"] == "${{ matrix.stack }}"
    assert up["environment"] == "${{ inputs.stack }}"
    for name in ("preview.yml", "up-stack.yml", "up.yml"):
        for job_name, job in load(name)["jobs"].items():
            if "uses" not in job:  # a called workflow's jobs carry their own
                assert 0 < job["timeout-minutes"] <= 60, (name, job_name)


def test_current_action_majors() -> None:
    wanted = {"actions/checkout": "v5", "actions/setup-python": "v6", "actions/github-script": "v8"}
    wanted |= {"actions/upload-artifact": "v5", "pulumi/actions": "v7"}
    for name in ("preview.yml", "up-stack.yml", "up.yml"):
        for job in load(name)["jobs"].values():
            for step in job.get("steps", []):
                if "uses" in step:
                    action, _, major = step["uses"].partition("@")
                    assert wanted[action] == major, step["uses"]


def test_the_render_diff_comment_is_trimmed_to_githubs_limit() -> None:
    script = next(
        s["with"]["script"]
        for s in load("preview.yml")["jobs"]["test-and-render-diff"]["steps"]
        if "github-script" in str(s.get("uses"))
    )
    assert "const limit = 60000;" in script and "artifact of [this run]" in script
    uploads = [
        s
        for s in load("preview.yml")["jobs"]["test-and-render-diff"]["steps"]
        if "upload-artifact" in str(s.get("uses"))
    ]
    assert uploads and uploads[0]["with"] == {"name": "render-diff", "path": "render-diff.md"}


def test_up_runs_every_stack_one_at_a_time_in_rollout_order() -> None:
    """The list comes from the stack files: a new environment needs no workflow edit."""
    workflow = load("up.yml")
    assert set(workflow[True]) == {"push", "workflow_dispatch"}
    assert workflow[True]["push"]["branches"] == ["main"]
    assert workflow[True]["workflow_dispatch"]["inputs"]["stack"]["type"] == "string"  # no second list of names
    jobs = workflow["jobs"]
    listing = next(s for s in jobs["test"]["steps"] if s.get("id") == "stacks")
    assert 'python -m offline.fleet --list ${STACK:+--only "$STACK"}' in listing["run"]
    up = jobs["up"]
    assert up["strategy"] == {
        "max-parallel": 1,
        "fail-fast": True,
        "matrix": {"stack": "${{ fromJSON(needs.test.outputs.stacks) }}"},
    }
    assert up["uses"] == "./.github/workflows/up-stack.yml" and up["with"]["stack"] == "${{ matrix.stack }}"
    up_stack = load("up-stack.yml")["jobs"]["up"]
    (step,) = pulumi_steps(load("up-stack.yml"), "up")
    assert step["with"]["command"] == "up" and step["with"]["refresh"] is True
    assert step["with"]["policyPacks"] == "policy"
    verify = up_stack["steps"][-1]
    assert "python -m cluster.verify --stack" in verify["run"]  # a mismatch fails the job, and the rest


def test_the_listed_order_puts_dev_before_prod(capsys: pytest.CaptureFixture[str]) -> None:
    assert fleet.main(["--list"]) == 0
    names = json.loads(capsys.readouterr().out)
    assert names.index("dev") < names.index("prod")
    assert sorted(names) == sorted(
        p.name[len("Pulumi.") : -len(".yaml")] for p in (ROOT / "stacks").glob("Pulumi.*.yaml")
    )


def test_the_policy_pack_needs_nothing_pulumi_does_not_install() -> None:
    """The pack runs in the project's virtualenv (PulumiPolicy.yaml), which Pulumi fills from requirements.txt."""
    assert "virtualenv: ../.venv" in (ROOT / "policy" / "PulumiPolicy.yaml").read_text()
    assert any(line.startswith("pulumi-policy==") for line in (ROOT / "requirements.txt").read_text().splitlines())
