"""The offline render, the project's main job: python -m offline.render."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from offline import render
from tests.support.rejections import REJECTIONS, Rejection
from tests.support.stacks import EXPOSED, changed, valid_config, write_stack

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.subprocess
def test_prod_render_end_to_end(tmp_path: Path) -> None:
    """The issue's acceptance: labels on both nodes, one plugin, no hidden UUID, quotas."""
    out = tmp_path / "prod"
    result = subprocess.run(
        [sys.executable, "-m", "offline.render", "--stack", "prod", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    stack = yaml.safe_load((ROOT / "stacks" / "Pulumi.prod.yaml").read_text())["config"]
    nodes = stack["hidden-gpu:nodes"]
    objects = {p.name: yaml.safe_load(p.read_text()) for p in out.glob("*.yaml")}
    patched = {o["metadata"]["name"] for o in objects.values() if o["kind"] == "Node"}
    assert patched == {n["name"] for n in nodes}
    # The plugin and the pinned dcgm-exporter (the default where a GPU is exposed), each given the exposed GPUs.
    daemonsets = [o for o in objects.values() if o["kind"] == "DaemonSet"]
    assert sorted(d["metadata"]["name"] for d in daemonsets) == [
        "dcgm-exporter-gpu-node-01",
        "nvidia-device-plugin-gpu-node-01",
    ]
    exposing = next(n for n in nodes if n["exposedGpus"])
    for daemonset in daemonsets:
        env = {e["name"]: e.get("value") for e in daemonset["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["NVIDIA_VISIBLE_DEVICES"].split(",") == exposing["exposedGpus"]
    rendered_text = "".join(p.read_text() for p in out.glob("*.yaml"))
    for hidden in (uuid for n in nodes for uuid in n.get("hiddenGpus", [])):
        assert hidden not in rendered_text
    quotas = {o["metadata"]["namespace"]: o["spec"]["hard"] for o in objects.values() if o["kind"] == "ResourceQuota"}
    assert quotas == {ns: {"requests.nvidia.com/gpu": str(n)} for ns, n in stack["hidden-gpu:quotas"].items()}
    rows = [line.split() for line in result.stdout.splitlines()]
    assert ["gpu-node-01", "2", "2", "6", "3"] in rows  # its RuntimeClass is the pool's; plugin and exporter
    assert ["gpu-node-02", "0", "0", "8", "1"] in rows


def test_render_is_byte_identical_across_runs(tmp_path: Path) -> None:
    stack_file = write_stack(tmp_path, valid_config())
    for out in ("a", "b"):
        assert render.main(["--stack-file", str(stack_file), "--out", str(tmp_path / out)]) == 0
    first = {p.name: p.read_bytes() for p in (tmp_path / "a").glob("*.yaml")}
    second = {p.name: p.read_bytes() for p in (tmp_path / "b").glob("*.yaml")}
    assert first == second and len(first) == 18


def test_rerender_replaces_stale_objects(tmp_path: Path) -> None:
    out = tmp_path / "out"
    stack_file = write_stack(tmp_path, valid_config())
    assert render.main(["--stack-file", str(stack_file), "--out", str(out)]) == 0
    stale = out / "resourcequota.ml-team.hidden-gpu-quota.yaml"
    assert stale.exists()
    write_stack(tmp_path, changed(lambda c: c.__setitem__("hidden-gpu:quotas", {})))
    assert render.main(["--stack-file", str(stack_file), "--out", str(out)]) == 0
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Pulumi.case.yaml", "out"]  # no staging left


def test_refuses_to_replace_a_directory_that_is_not_a_render(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    assert render.main(["--stack-file", str(write_stack(tmp_path, valid_config())), "--out", str(tmp_path)]) == 2
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    assert "exists and was not written by hidden-gpu" in capsys.readouterr().err


@pytest.mark.parametrize("case", REJECTIONS, ids=lambda case: case.id)
def test_invalid_config_exits_2_and_writes_nothing(
    case: Rejection, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    path = write_stack(tmp_path, case.config)
    assert render.main(["--stack-file", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}:"), err
    found = re.match(rf"error: {re.escape(str(path))}:(\d+): ", err)
    if found is None:  # a required key the file lacks altogether: the file, no line
        assert err.startswith(f"error: {path}: {case.key}: required key is missing"), err
    else:
        assert err[found.end() :].startswith(case.key), err
        # The line named holds the key (its name, or a list item's dash), or the nearest key around it
        # that the file has (a missing key's mapping, a rule across a section's keys).
        text = path.read_text().splitlines()[int(found.group(1)) - 1]
        parts = [p for p in re.split(r"[.\[\]: ]", case.key) if p and not p.isdigit()]
        assert text.lstrip().startswith("-") or any(f"{p}:" in text for p in parts), (text, err)
    assert case.reason in err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["Pulumi.case.yaml"]


@pytest.mark.subprocess
def test_invalid_config_through_the_real_command(tmp_path: Path) -> None:
    """No traceback reaches the user: one line on stderr, exit status 2."""
    case = REJECTIONS[0]
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "offline.render",
            "--stack-file",
            str(write_stack(tmp_path, case.config)),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"error: {tmp_path / 'Pulumi.case.yaml'}:8: {case.key} = 0: a GPU index, not a UUID"
    )
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stack", "no-such"], "--stack no-such: no stack file Pulumi.no-such.yaml in stacks/ (stacks: "),
        (["--stack-file", "/nonexistent/Pulumi.x.yaml"], "cannot read stack file"),
    ],
)
def test_unknown_stack_exits_2(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert render.main([*args, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_stack_file_that_is_not_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text("config: [unclosed\n")
    assert render.main(["--stack-file", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "Pulumi.bad.yaml:2: not valid YAML" in capsys.readouterr().err


def test_summary_lists_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert render.main(["--stack-file", str(write_stack(tmp_path, valid_config())), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"stack case: 18 objects written to {tmp_path / 'o'}"
    assert out[1].split() == ["node", "exposed", "advertised", "hidden", "objects"]
    assert out[2].split() == ["gpu-node-01", "1", "1", "2", "4"]
    assert out[3].split() == ["gpu-node-02", "0", "0", "2", "1"]
    assert out[4] == "  quotas (requests.nvidia.com/gpu): ml-team=1"
    assert (
        out[5]
        == "  guard: enforce; exempt namespaces: gpu-operator, hidden-gpu-system, kube-system; exempt by label: none"
    )
    assert out[6:] == ["  GPUs in stack order (■ exposed, □ hidden):", "    gpu-node-01  ■□□", "    gpu-node-02  □□"]


def test_summary_as_json_and_in_ascii(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stack_file = write_stack(tmp_path, valid_config())
    assert render.main(["--stack-file", str(stack_file), "--out", str(tmp_path / "o"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["objects"] == 18 and data["quotas"] == {"ml-team": 1} and data["warnings"] == []
    first = data["nodes"][0]
    assert first["name"] == "gpu-node-01" and first["gpus"]["exposed"] == [EXPOSED] and first["objects"] == 4
    rendered = render.summary(data, ascii_only=True).splitlines()
    assert rendered[6:9] == [
        "  GPUs in stack order (# exposed, - hidden):",
        "    gpu-node-01  #--",
        "    gpu-node-02  --",
    ]


def test_the_programs_quota_warning_is_printed_once(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    config = valid_config()
    config["hidden-gpu:quotas"] = {"ml-team": 5}
    assert render.main(["--stack-file", str(write_stack(tmp_path, config)), "--out", str(tmp_path / "o")]) == 0
    out, err = capfd.readouterr()
    assert err == "" and out.endswith("\n")
    warnings = [line for line in out.splitlines() if "ml-team = 5" in line]
    assert warnings == [
        "warning: hidden-gpu:quotas.ml-team = 5: more than the 1 nvidia.com/gpu this stack's nodes advertise"
    ]


def test_an_allowed_device_class_is_a_warning_where_gpus_are_hidden(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The render cannot read a class's selector, so it says where `cluster.verify` must look; with no hidden GPU
    there is nothing for a class to reach."""
    config = valid_config()
    config["hidden-gpu:guard"] = {"allowedDeviceClasses": ["nic.example.com"]}
    assert (
        render.main(["--stack-file", str(write_stack(tmp_path, config)), "--out", str(tmp_path / "o"), "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["warnings"] == [
        "hidden-gpu:guard.allowedDeviceClasses[0] = nic.example.com: tenants may claim every device this class "
        "selects and the render cannot read its selector; `cluster.verify` fails if it selects a hidden GPU (a "
        "device whose `uuid` attribute is one)"
    ]
    for node in config["hidden-gpu:nodes"]:
        node["exposedGpus"], node["hiddenGpus"] = node["exposedGpus"] + node["hiddenGpus"], []
    assert (
        render.main(["--stack-file", str(write_stack(tmp_path, config)), "--out", str(tmp_path / "p"), "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["warnings"] == []
