"""The GitHub workflows: schema-valid (as `make lint` checks them) and wired as documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

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
    assert [p.name for p in WORKFLOWS] == ["preview.yml", "up.yml"]
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
    assert any("scripts/render_diff.sh" in str(s.get("run", "")) for s in render_job["steps"])
    preview = workflow["jobs"]["pulumi-preview"]
    assert preview["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.test-and-render-diff.outputs.stacks) }}"
    (step,) = pulumi_steps(workflow, "pulumi-preview")
    assert step["uses"] == "pulumi/actions@v7"
    assert step["with"]["command"] == "preview" and step["with"]["comment-on-pr"] is True
    assert step["with"]["cloud-url"] == "${{ secrets.PULUMI_BACKEND_URL }}"
    assert step["env"]["KUBECONFIG"] == "${{ runner.temp }}/kubeconfig"
    assert step["with"]["policyPacks"] == "policy"


def test_up_is_guarded_by_an_environment() -> None:
    workflow = load("up.yml")
    assert set(workflow[True]) == {"push", "workflow_dispatch"}
    assert workflow[True]["push"]["branches"] == ["main"]
    up = workflow["jobs"]["up"]
    assert up["environment"] == "${{ matrix.stack }}"
    (step,) = pulumi_steps(workflow, "up")
    assert step["with"]["command"] == "up"
    assert step["with"]["policyPacks"] == "policy"
