"""One config, reviewed: what `pulumi up` applies is what the stack file says and render shows.

The CLI reads YAML 1.2 and merges values from ESC environments, Pulumi.yaml and --config; the reader
refuses what the two readings disagree on, and the program refuses any value the file does not hold
(tests/real/test_pulumi_cli.py runs that refusal under the real CLI)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pulumi
import pytest
import yaml

from common.cli import EXIT_USAGE
from offline import render
from offline.program import run_program
from stack_config import InvalidConfigError, parse_project_config
from stack_config.load import read_stack_file
from stack_config.reviewed import check_reviewed, handed_config, project_config_problems
from stack_config.stack_yaml import cli_reading
from tests.support.stacks import CLUSTER_YAML, valid_config, write_stack

NODES = "  hidden-gpu:nodes: [{name: n, exposedGpus: []}]\n"


@pytest.mark.parametrize(
    ("value", "ours", "theirs"),
    [
        ("1:30", "90", '"1:30"'),  # sexagesimal: YAML 1.1 only
        ("1e3", '"1e3"', "1000.0"),  # an exponent without a dot: YAML 1.2 only
        ("0o7", '"0o7"', "7"),
        ("08", '"08"', "8.0"),
        ("2026-12-03", '"2026-12-03"', "a timestamp"),
    ],
)
def test_scalars_the_cli_reads_differently_are_refused_with_both_readings(
    value: str, ours: str, theirs: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(f"config:\n{CLUSTER_YAML}{NODES}  hidden-gpu:quotas:\n    team: {value}\n")
    assert render.main(["--stack-file", str(path), "--out", str(tmp_path / "o")]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"error: {path}:6: hidden-gpu:quotas.team = {value}: read as {ours} here and as {theirs} "
        "by the Pulumi CLI (YAML 1.2); quote it, or write the value plainly\n"
    )


@pytest.mark.parametrize(("value", "read"), [("3", 3), ("010", 8), ("0x10", 16), ("1_000", 1000), ('"1:30"', "1:30")])
def test_scalars_both_read_alike_pass(value: str, read: object, tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(f"config:\n{CLUSTER_YAML}{NODES}  hidden-gpu:devicePlugin:\n    namespace: {value}\n")
    loaded = yaml.safe_load(path.read_text())["config"]["hidden-gpu:devicePlugin"]["namespace"]
    assert loaded == read and (value.startswith('"') or cli_reading(value) == read)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("hiden-gpu:quotas", "unknown namespace 'hiden-gpu'; did you mean 'hidden-gpu:quotas'?"),
        ("Hidden-GPU:quotas", "unknown namespace 'Hidden-GPU'; did you mean 'hidden-gpu:quotas'?"),
        ("hidden_gpu:quotas", "unknown namespace 'hidden_gpu'; did you mean 'hidden-gpu:quotas'?"),
        ("hidden-gpu\u200b:quotas", "config key holds a character no reviewer sees (U+200B); retype it"),
        ("\ufeffhidden-gpu:quotas", "config key holds a character no reviewer sees (U+FEFF); retype it"),
    ],
)
def test_a_namespace_that_looks_like_ours_is_refused(key: str, message: str) -> None:
    """Pulumi files these under another namespace: dev's quotas would silently be none."""
    config = valid_config() | {key: {"ml-dev": 1}}
    with pytest.raises(InvalidConfigError) as refused:
        parse_project_config(config)
    assert str(refused.value) == f"{key}: {message}"


def test_other_namespaces_still_pass() -> None:
    assert parse_project_config(valid_config() | {"aws:region": "eu-west-1", "gpu:x": 1}).nodes


def test_project_config_for_our_namespace_is_refused(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text(
        "name: hidden-gpu\nruntime: python\nconfig:\n  hidden-gpu:guard:\n    value: {mode: audit}\n"
        "  kubernetes:context: {value: x}\n"
    )
    assert [str(p) for p in project_config_problems(tmp_path)] == [
        f"{tmp_path / 'Pulumi.yaml'}: config.hidden-gpu:guard: sets a value for every stack that no stack file "
        "shows; write it in each stack file instead"
    ]


def test_declarations_pass_and_defaults_do_not(tmp_path: Path) -> None:
    """Pulumi.yaml may declare our keys' types (it does: offline.config_reference writes them); a default
    or a value there is config no stack file shows."""
    (tmp_path / "Pulumi.yaml").write_text(
        "name: hidden-gpu\nruntime: python\nconfig:\n  nodes: {type: array, items: {type: object}}\n"
        "  guard: {type: object, default: {mode: audit}}\n  quotas: {}\n  devicePlugin: {type: object, default: {}}\n"
        "  rolloutWave: {type: integer, default: 0}\n  clusterPolicy: {type: object, default: {patch: true}}\n"
    )
    assert [p.where for p in project_config_problems(tmp_path)] == [
        f"{tmp_path / 'Pulumi.yaml'}: config.{key}" for key in ("guard", "clusterPolicy")
    ]


def test_the_repositorys_project_sets_no_config_of_ours() -> None:
    assert project_config_problems(Path(__file__).resolve().parent.parent) == []


def test_a_value_the_file_does_not_hold_is_refused(tmp_path: Path) -> None:
    """What `pulumi up` hands the program after merging an ESC environment's `hidden-gpu:guard`."""
    (tmp_path / "Pulumi.yaml").write_text("name: hidden-gpu\nruntime: python\nstackConfigDir: stacks\n")
    (tmp_path / "stacks").mkdir()
    write_stack(tmp_path / "stacks", valid_config(), "prod")
    merged = copy.deepcopy(valid_config())
    merged["hidden-gpu:guard"] = {"mode": "audit", "exemptNamespaces": ["kube-system", "tenant-a"]}
    check_reviewed(parse_project_config(valid_config()), tmp_path, "prod")  # the file's own config passes
    with pytest.raises(InvalidConfigError) as refused:
        check_reviewed(parse_project_config(merged), tmp_path, "prod")
    assert str(refused.value).startswith(f"hidden-gpu:guard: differs from {tmp_path / 'stacks/Pulumi.prod.yaml'}:")


def test_the_program_reads_every_key_it_knows_and_every_key_the_file_names(tmp_path: Path) -> None:
    """The program asks the CLI one key at a time (the public pulumi.Config cannot list keys): the file's misspelt
    key reaches the parser and is refused, an ESC environment's value of a known key reaches check_reviewed, and a
    name only ESC adds, which nothing reads, is never asked for."""
    config = valid_config() | {"hidden-gpu:quota": {"team": 1}}
    written = read_stack_file(write_stack(tmp_path, config, "prod"))
    cli = {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}
    cli |= {"hidden-gpu:guard": json.dumps({"mode": "audit"}), "hidden-gpu:esc-only": "x", "aws:region": "y"}
    asked: list[str] = []

    def value_of(key: str) -> str | None:
        asked.append(key)
        return cli.get(key)

    handed = handed_config(written, value_of)
    assert handed == {k: v for k, v in cli.items() if k not in ("hidden-gpu:esc-only", "aws:region")}
    assert len(asked) == len(set(asked)) and "hidden-gpu:esc-only" not in asked
    with pytest.raises(InvalidConfigError) as refused:
        parse_project_config(handed)
    assert "hidden-gpu:quota" in str(refused.value)


def test_the_harness_runs_the_programs_check_against_the_file(tmp_path: Path) -> None:
    """Offline, as under the CLI: a map that says more than the file it was read from is refused by the program
    (the harness names the file to it; nothing in stack_config/ lets the harness through)."""
    path = write_stack(tmp_path, valid_config(), "prod")
    handed = read_stack_file(path)
    run_program(handed, "prod")  # the file's own map runs
    handed["hidden-gpu:guard"] = {"mode": "audit"}
    with pytest.raises(pulumi.RunError, match=r"hidden-gpu:guard: differs from .*Pulumi\.prod\.yaml"):
        run_program(handed, "prod")


def test_without_its_stack_file_the_program_does_not_run(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: hidden-gpu\nruntime: python\n")
    with pytest.raises(InvalidConfigError) as refused:
        check_reviewed(parse_project_config(valid_config()), tmp_path, "prod")
    assert "Pulumi.prod.yaml: cannot read stack file" in str(refused.value)


def test_render_names_the_esc_environments_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_stack(tmp_path, valid_config())
    path.write_text("environment:\n  - platform/kube-credentials\n" + path.read_text())
    assert render.main(["--stack-file", str(path), "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "warning: the stack imports ESC environments (platform/kube-credentials) that this render cannot read; "
        "`pulumi up` refuses any hidden-gpu: value they change"
    )


@pytest.mark.parametrize(
    ("text", "line", "ours"),
    [
        ("config:\n  hidden-gpu:nodes:\n    - name: a\n   exposedGpus: []\n", 4, "a line is indented differently"),
        ("config:\n  a: b: c\n", 2, "quote a value that holds ': '"),
        ("config:\n\t a: 1\n", 2, "YAML indents with spaces"),
        ('config:\n  a: "x\n', 3, "a quote or bracket is never closed"),
        ("config:\n  a: [1, 2\n", 3, "a [list] is not closed"),
    ],
    ids=["indentation", "colon-in-value", "tab", "open-quote", "open-list"],
)
def test_yaml_slips_are_explained_in_our_words(
    text: str, line: int, ours: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(text)
    assert render.main(["--stack-file", str(path), "--out", str(tmp_path / "o")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:{line}: not valid YAML: ") and ours in err and err.count("\n") == 1


def test_a_request_above_its_limit_is_refused_offline() -> None:
    """The API server would refuse the DaemonSet at `up`; the stack file is where to say so."""
    config = valid_config() | {"hidden-gpu:devicePlugin": {"resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}}
    with pytest.raises(InvalidConfigError) as refused:
        parse_project_config(config)
    assert str(refused.value).splitlines() == [
        'hidden-gpu:devicePlugin.resources.requests.cpu = "2": above its limit 500m',
        'hidden-gpu:devicePlugin.resources.requests.memory = "1Gi": above its limit 256Mi',
    ]


def test_a_partial_override_keeps_the_other_defaults() -> None:
    config = valid_config() | {"hidden-gpu:devicePlugin": {"resources": {"limits": {"memory": "1Gi"}}}}
    resources = parse_project_config(config).device_plugin.resources
    assert (resources.limits.cpu, resources.limits.memory) == ("500m", "1Gi")
    assert (resources.requests.cpu, resources.requests.memory) == ("50m", "64Mi")
