"""The GitHub workflows: schema-valid (as `make lint` checks them) and wired as documented."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from offline import fleet

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
WORKFLOW_NAMES = [p.name for p in WORKFLOWS]
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


def validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    command = [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.github-workflows", *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def load(name: str) -> dict[Any, Any]:
    workflow: dict[Any, Any] = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    return workflow


def test_the_workflows_are_schema_valid() -> None:
    assert [p.name for p in WORKFLOWS] == ["drift.yml", "preview.yml", "repair.yml", "up-stack.yml", "up.yml"]
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
    assert step["env"]["KUBECONFIG"] == "${{ runner.temp }}/kubeconfig"
    # Judged by the base commit's pack, which the pull request cannot change.
    assert step["with"]["policyPacks"] == "${{ runner.temp }}/base/policy"
    base = next(s for s in preview["steps"] if "base_policy_pack.sh" in str(s.get("run")))
    assert base["run"] == 'scripts/base_policy_pack.sh "$BASE_SHA" "$RUNNER_TEMP/base"'
    assert base["env"]["BASE_SHA"] == "${{ github.event.pull_request.base.sha }}"


def up_step() -> dict[str, Any]:
    """The step of up-stack.yml that runs `pulumi up` (the CLI itself, under `timeout`)."""
    steps: list[dict[str, Any]] = load("up-stack.yml")["jobs"]["up"]["steps"]
    (step,) = [s for s in steps if "pulumi up" in str(s.get("run", ""))]
    return step


def pulumi_step_sets() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(job, pulumi step) for every job that runs Pulumi."""
    preview, up = load("preview.yml"), load("up-stack.yml")
    return [
        (preview["jobs"]["pulumi-preview"], pulumi_steps(preview, "pulumi-preview")[0]),
        (up["jobs"]["up"], up_step()),
    ]


def test_stacks_are_never_created_by_a_workflow_and_the_cli_is_pinned() -> None:
    """upsert with a passphrase would write an encryptionsalt on the runner that nobody commits."""
    version = (ROOT / ".pulumi-version").read_text().strip()
    pinned = next(line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("pulumi=="))
    assert pinned == f"pulumi=={version}"  # the CLI and the SDK move together
    for step in [pulumi_steps(load("preview.yml"), "pulumi-preview")[0], pulumi_steps(load("drift.yml"), "drift")[0]]:
        assert step["with"]["upsert"] is False and "secrets-provider" not in step["with"]
        assert step["with"]["pulumi-version-file"] == ".pulumi-version"
        assert step["with"]["cloud-url"] == "${{ vars.PULUMI_BACKEND_URL }}"
    # up runs the CLI itself: non-interactive, it refuses a stack that does not exist instead of offering to make
    # one (pulumi pkg/v3 v3.274.0 cmd/pulumi/stack/io.go:157-171).
    (install,) = pulumi_steps(load("up-stack.yml"), "up")
    assert install["with"] == {"pulumi-version-file": ".pulumi-version"}  # only installs the pinned CLI
    up = up_step()
    assert "--non-interactive" in up["run"] and "--create" not in up["run"] and "stack init" not in up["run"]
    assert 'pulumi login "$PULUMI_BACKEND_URL"' in up["run"]
    assert up["env"]["PULUMI_BACKEND_URL"] == "${{ vars.PULUMI_BACKEND_URL }}"


def test_previews_never_run_with_what_up_may_do() -> None:
    """A pull request's code runs in `<stack>-preview` (read-only credentials, no reviewers); only merged code
    reaches the stack's own environment. Cloud credentials come from OIDC roles, never static keys."""
    preview, up = (job for job, _ in pulumi_step_sets())
    assert preview["environment"] == "${{ matrix.stack }}-preview"
    assert up["environment"] == "${{ inputs.environment || inputs.stack }}"  # the stack's own, or its `-repair`
    assert load("drift.yml")["jobs"]["drift"]["environment"] == "${{ matrix.stack }}-preview"
    roles = {}
    for name in WORKFLOW_NAMES:
        text = (ROOT / ".github" / "workflows" / name).read_text()
        assert "AWS_ACCESS_KEY_ID" not in text and "AWS_SECRET_ACCESS_KEY" not in text, name
        for job_name, job in load(name)["jobs"].items():
            for step in job.get("steps", []):
                if str(step.get("uses", "")).startswith("aws-actions/configure-aws-credentials@"):
                    assert job["permissions"]["id-token"] == "write", (name, job_name)
                    roles[(name, job_name)] = step["with"]["role-to-assume"]
    assert roles == {
        ("drift.yml", "drift"): "${{ vars.PULUMI_STATE_READ_ROLE }}",
        ("preview.yml", "pulumi-preview"): "${{ vars.PULUMI_STATE_READ_ROLE }}",
        ("up-stack.yml", "up"): "${{ vars.PULUMI_STATE_ROLE }}",
    }


def test_every_pulumi_job_has_a_timeout() -> None:
    for name in WORKFLOW_NAMES:
        for job_name, job in load(name)["jobs"].items():
            if "uses" not in job:  # a called workflow's jobs carry their own
                assert 0 < job["timeout-minutes"] <= 60, (name, job_name)


def test_an_up_is_ended_cleanly_before_any_limit_kills_it() -> None:
    """issue 32, 3: a job killed at its limit leaves the stack locked with pending operations. `timeout` sends the
    up SIGINT first, which Pulumi takes as ^C: it stops starting operations, finishes those under way and releases
    the lock (pulumi pkg/v3 v3.274.0 backend/cancellation_scope.go:64-100, backend/diy/backend.go:1222-1226);
    only a second signal terminates it. The kill comes later, and the step's and the job's limits later still."""
    job = load("up-stack.yml")["jobs"]["up"]
    step = up_step()
    found = re.search(r"timeout --signal=INT --kill-after=(\d+)m (\d+)m \\\n\s*pulumi up ", step["run"])
    assert found, step["run"]
    grace, limit = int(found[1]), int(found[2])
    verify = job["steps"][-1]
    assert "cluster.verify" in verify["run"]
    setup = 3  # checkout, Python, the virtualenv, credentials, the CLI
    assert limit + grace < step["timeout-minutes"]
    assert setup + step["timeout-minutes"] + verify["timeout-minutes"] <= job["timeout-minutes"]
    assert "124)" in step["run"] and "137)" in step["run"]  # each end says what state the stack is in
    for name, job_name in (("preview.yml", "pulumi-preview"), ("drift.yml", "drift")):
        (preview,) = pulumi_steps(load(name), job_name)
        assert preview["timeout-minutes"] < load(name)["jobs"][job_name]["timeout-minutes"]


def test_no_credential_is_a_static_github_secret() -> None:
    """issue 32, 4: the kubeconfig and the passphrase come from AWS Secrets Manager, read with the environment's
    OIDC role; GitHub holds only their names (variables). The passphrase reaches Pulumi as a file."""
    for name in WORKFLOW_NAMES:
        text = (ROOT / ".github" / "workflows" / name).read_text()
        assert not re.findall(r"secrets\.(?!GITHUB_TOKEN)\w+", text), name
        for job_name, job in load(name)["jobs"].items():
            steps = job.get("steps", [])
            reads = [i for i, s in enumerate(steps) if "aws secretsmanager get-secret-value" in str(s.get("run"))]
            if not reads:
                continue
            roles = [i for i, s in enumerate(steps) if "configure-aws-credentials" in str(s.get("uses"))]
            assert roles and roles[0] < reads[0], (name, job_name)
            assert steps[reads[0]]["env"] == {
                "KUBECONFIG_SECRET": "${{ vars.KUBECONFIG_SECRET }}",
                "PASSPHRASE_SECRET": "${{ vars.PASSPHRASE_SECRET }}",
            }
            assert 'install -m 600 /dev/null "$RUNNER_TEMP/passphrase"' in steps[reads[0]]["run"]
            pulumi = [s for s in steps if "pulumi/actions" in str(s.get("uses")) and "command" in s.get("with", {})]
            pulumi += [s for s in steps if "pulumi up" in str(s.get("run", ""))]
            for step in pulumi:
                assert step["env"]["PULUMI_CONFIG_PASSPHRASE_FILE"] == "${{ runner.temp }}/passphrase"
                assert "PULUMI_CONFIG_PASSPHRASE" not in step["env"]


# Every action by the commit of a release, its tag beside it: a moved or deleted tag changes nothing.
PINNED = {
    "actions/checkout": ("fbc6f3992d24b796d5a048ff273f7fcc4a7b6c09", "v5.1.0"),
    "actions/setup-python": ("ece7cb06caefa5fff74198d8649806c4678c61a1", "v6.3.0"),
    "actions/github-script": ("ed597411d8f924073f98dfc5c65a23a2325f34cd", "v8.0.0"),
    "actions/upload-artifact": ("330a01c490aca151604b8cf639adc76d48f6c5d4", "v5.0.0"),
    "pulumi/actions": ("8e5e406f4007fca908480587cb9893c07090f58d", "v7.0.0"),
    "aws-actions/configure-aws-credentials": ("61815dcd50bd041e203e49132bacad1fd04d2708", "v5.1.1"),
}


def test_actions_are_pinned_by_commit() -> None:
    for name in WORKFLOW_NAMES:
        for line in (ROOT / ".github" / "workflows" / name).read_text().splitlines():
            found = re.search(r"uses: ([\w.-]+/[\w.-]+)@(\S+)(?: # (\S+))?$", line)
            if found is None:
                continue
            action, ref, tag = found.groups()
            assert (ref, tag) == PINNED[action], f"{name}: {line.strip()}"


def test_the_drift_job_expects_no_changes_after_a_refresh_and_speaks_up() -> None:
    workflow = load("drift.yml")
    assert "schedule" in workflow[True] and "workflow_dispatch" in workflow[True]
    job = workflow["jobs"]["drift"]
    assert job["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.stacks.outputs.stacks) }}"
    (step,) = pulumi_steps(workflow, "drift")
    assert step["with"]["command"] == "preview"
    assert step["with"]["refresh"] is True and step["with"]["expect-no-changes"] is True
    assert any("python -m cluster.verify --stack" in str(s.get("run")) for s in job["steps"])
    report = job["steps"][-1]
    assert report["if"] == "failure()" and "issues.create" in report["with"]["script"]


@pytest.mark.subprocess
def test_a_pull_request_that_weakens_the_pack_is_judged_by_the_base_pack(tmp_path: Path) -> None:
    """The PR deletes a mandatory rule; the pack scripts/base_policy_pack.sh lays out still has it."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True, check=True).stdout
    rules = clone / "policy" / "rules.py"
    rules.write_text(
        rules.read_text() + "\nPOLICIES = [p for p in POLICIES if p.name != 'device-plugin-unprivileged']\n"
    )
    git = ["git", "-c", "user.name=pr", "-c", "user.email=pr@example.com"]
    subprocess.run([*git, "commit", "-qam", "weaken the pack"], cwd=clone, check=True)
    (clone / ".venv").symlink_to(ROOT / ".venv")
    script = str(ROOT / "scripts" / "base_policy_pack.sh")  # this checkout's script, run in the PR's clone
    subprocess.run([script, base.strip(), str(tmp_path / "base")], cwd=clone, check=True)
    names = "import sys; sys.path.insert(0, sys.argv[1]); from policy.rules import POLICIES; print(*[p.name for p in POLICIES])"
    head = subprocess.run([sys.executable, "-c", names, str(clone)], capture_output=True, text=True, check=True).stdout
    judged = subprocess.run(
        [sys.executable, "-c", names, str(tmp_path / "base")], capture_output=True, text=True, check=True
    ).stdout
    assert "device-plugin-unprivileged" not in head.split()
    assert "device-plugin-unprivileged" in judged.split()
    assert (tmp_path / "base" / ".venv").resolve() == (ROOT / ".venv").resolve()


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
    command = up_step()["run"]
    assert 'pulumi up --stack "$STACK" --yes --non-interactive --refresh' in command
    assert "--policy-pack policy" in command
    verify = up_stack["steps"][-1]
    assert "python -m cluster.verify --stack" in verify["run"]  # a mismatch fails the job, and the rest


def test_repair_runs_the_merges_up_on_a_schedule_never_beside_it() -> None:
    """issue 32, 2: drift repaired within the schedule's period: every stack's up (refresh, verify after, the
    merge's reusable job), one at a time in rollout order, in the merge's concurrency group."""
    repair, up = load("repair.yml"), load("up.yml")
    assert set(repair[True]) == {"schedule", "workflow_dispatch"}
    assert repair[True]["schedule"] == [{"cron": "*/15 * * * *"}]
    job = repair["jobs"]["repair"]
    # issue 42, 4: only the repair's up job joins the merge's group, and only when no merge's up runs or waits
    # (GitHub cancels a group's pending run when another queues); in its own environment, without reviewers.
    assert "concurrency" not in repair
    assert job["concurrency"] == up["concurrency"] == {"group": "pulumi-up", "cancel-in-progress": False}
    assert job["if"] == "needs.stacks.outputs.stacks != '[]'"
    assert job["uses"] == up["jobs"]["up"]["uses"] and job["with"]["stack"] == up["jobs"]["up"]["with"]["stack"]
    assert job["with"]["environment"] == "${{ matrix.stack }}-repair" and "environment" not in up["jobs"]["up"]["with"]
    assert load("up-stack.yml")["jobs"]["up"]["environment"] == "${{ inputs.environment || inputs.stack }}"
    assert job["strategy"]["max-parallel"] == 1 and job["strategy"]["fail-fast"] is True
    listing = next(s for s in repair["jobs"]["stacks"]["steps"] if s.get("id") == "stacks")
    assert "python -m offline.fleet --list" in listing["run"] and "gh run list --workflow up.yml" in listing["run"]


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
