"""Nothing lost, nothing hidden from review: the ordinary mistakes of issue 15, as tests (render's writes, which
destroy nothing, are tests/test_render_output_safety.py). Each test here failed on the code before the change that
introduced it (see its commit)."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.cli import EXIT_INTERNAL, EXIT_USAGE, stack_files
from common.names import DEFAULT_PLUGIN_NAMESPACE
from common.tokens import Token
from components.toolkit_settings import CLUSTER_POLICY_API, CLUSTER_POLICY_KIND
from host import audit, discover
from offline import diff, render
from offline.program import LiveObjectMissingError, run_program
from tests.support.fake_nvml import FakeGpu, fake_nvml
from tests.support.objects import only, plugins
from tests.support.stacks import (
    CLUSTER_YAML,
    EXPOSED,
    HIDDEN,
    changed,
    cluster_policy_patched,
    node,
    valid_config,
    write_stack,
)

ROOT = Path(__file__).resolve().parent.parent
STACK_FILES = stack_files()
CLUSTER_POLICY = f"kubernetes:{CLUSTER_POLICY_API}:{CLUSTER_POLICY_KIND}"


# --- 2. One strict reader ---

DUPLICATE_EXPOSED = f"""config:
  hidden-gpu:nodes:
    - name: gpu-node-01
      exposedGpus: [{EXPOSED}]
      hiddenGpus: [{HIDDEN[0]}]
      exposedGpus: [{EXPOSED}, {HIDDEN[0]}]
"""


def duplicate_stack(tmp_path: Path) -> Path:
    path = tmp_path / "Pulumi.dup.yaml"
    path.write_text(DUPLICATE_EXPOSED)
    return path


def expect_both_lines(status: int, err: str, path: Path) -> None:
    assert status == EXIT_USAGE
    assert err == (
        f"error: {path}:6: key 'config.hidden-gpu:nodes[0].exposedGpus' given twice (lines 4 and 6): "
        "a reviewer reads one, YAML keeps the other\n"
    )


def test_duplicate_key_refused_by_render(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = duplicate_stack(tmp_path)
    status = render.main(["--stack-file", str(path), "--out", str(tmp_path / "out")])
    expect_both_lines(status, capsys.readouterr().err, path)
    assert not (tmp_path / "out").exists()


def test_duplicate_key_refused_by_discover(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = duplicate_stack(tmp_path)
    nvml = fake_nvml([FakeGpu(EXPOSED), FakeGpu(HIDDEN[0])])
    status = discover.main(["--check", "--stack-file", str(path), "--node", "gpu-node-01"], nvml=nvml)
    expect_both_lines(status, capsys.readouterr().err, path)


def test_duplicate_key_refused_by_audit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = duplicate_stack(tmp_path)
    nvml = fake_nvml([FakeGpu(EXPOSED), FakeGpu(HIDDEN[0])])
    status = audit.main(["--stack-file", str(path), "--node", "gpu-node-01"], nvml=nvml)
    expect_both_lines(status, capsys.readouterr().err, path)


def test_a_duplicated_top_level_key_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "Pulumi.g.yaml"
    path.write_text(
        "config:\n"
        + CLUSTER_YAML
        + "  hidden-gpu:guard: {mode: enforce}\n  hidden-gpu:nodes: [{name: n, exposedGpus: []}]\n"
        "  hidden-gpu:guard: {mode: audit}\n"
    )
    assert render.main(["--stack-file", str(path), "--out", str(tmp_path / "o")]) == EXIT_USAGE
    assert "key 'config.hidden-gpu:guard' given twice (lines 4 and 6)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "x: &gpus [GPU-5f3c1a2b-7d4e-4c1f-9a0b-1c2d3e4f5a6b]\nconfig:\n" + CLUSTER_YAML + ""
            "  hidden-gpu:nodes: [{name: n, exposedGpus: *gpus}]\n",
            "aliases and merge keys are refused under hidden-gpu:",
        ),
        (
            "config:\n"
            + CLUSTER_YAML
            + "  hidden-gpu:devicePlugin:\n    <<: {namespace: other}\n  hidden-gpu:nodes: [{name: n, exposedGpus: []}]\n",
            "aliases and merge keys are refused under hidden-gpu:",
        ),
        (
            "config:\n"
            + CLUSTER_YAML
            + "  hidden-gpu:nodes: [{name: n, exposedGpus: []}]\n  hidden-gpu:clusterPolicy:\n"
            "    patch:\n      secure: v1:abc\n",
            "hidden-gpu:clusterPolicy.patch: is a Pulumi secret (secure:)",
        ),
        (
            "config:\n"
            + CLUSTER_YAML
            + "  hidden-gpu:nodes: [{name: n, exposedGpus: []}]\n  hidden-gpu:clusterPolicy: {patch: yes}\n",
            'hidden-gpu:clusterPolicy.patch = "yes": must be true or false',
        ),
    ],
    ids=["alias", "merge-key", "secret", "yaml-1.1-boolean"],
)
def test_what_a_reviewer_cannot_read_is_refused(
    text: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(text)
    assert render.main(["--stack-file", str(path), "--out", str(tmp_path / "o")]) == EXIT_USAGE
    assert reason in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_comments_and_order_of_stack_files_stay_as_written(tmp_path: Path) -> None:
    before = {p: p.read_bytes() for p in STACK_FILES}
    for path in STACK_FILES:
        assert render.main(["--stack-file", str(path), "--out", str(tmp_path / path.stem)]) == 0
    assert {p: p.read_bytes() for p in STACK_FILES} == before


# --- 3. The ClusterPolicy patch loses nothing ---

FOREIGN = {"name": "CONTAINERD_CONFIG", "value": "/etc/containerd/config.toml"}


def live_cluster_policy(**spec: Any) -> dict[tuple[str, str], dict[str, Any]]:
    obj = {"apiVersion": CLUSTER_POLICY_API, "kind": CLUSTER_POLICY_KIND, "metadata": {"name": "cluster-policy"}}
    return {(CLUSTER_POLICY, "cluster-policy"): {**obj, "spec": spec}}


PATCHED = changed(cluster_policy_patched)


def test_foreign_toolkit_env_entries_survive_the_patch() -> None:
    live = live_cluster_policy(
        toolkit={"env": [FOREIGN, {"name": "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS", "value": "false"}]},
        devicePlugin={"env": [{"name": "FOO", "value": "1"}]},
    )
    run = run_program(PATCHED, "test", live=live)
    patch = only(run.of_type(Token.CLUSTER_POLICY_PATCH))
    assert patch.inputs["spec"]["toolkit"]["env"] == [
        FOREIGN,
        {"name": "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED", "value": "false"},
        {"name": "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS", "value": "true"},
    ]
    assert patch.inputs["spec"]["devicePlugin"]["env"] == [
        {"name": "FOO", "value": "1"},
        {"name": "DEVICE_LIST_STRATEGY", "value": "volume-mounts"},
    ]
    assert run.reads == [(CLUSTER_POLICY, "cluster-policy")]
    assert patch.retain_on_delete


def test_an_unreadable_cluster_policy_is_never_replaced() -> None:
    with pytest.raises(LiveObjectMissingError, match="cluster-policy does not exist"):
        run_program(PATCHED, "test", live={})


# --- 4. Review shows GPUs ---


def render_to(tmp_path: Path, name: str, config: dict[str, Any]) -> Path:
    """Stack `case` as `config` has it, rendered into tmp_path/name: a review compares one stack's two renders."""
    out, files = tmp_path / name, tmp_path / f"{name}-stack"
    files.mkdir()
    assert render.main(["--stack-file", str(write_stack(files, config)), "--out", str(out)]) == 0
    return out


def with_third_node(config: dict[str, Any]) -> None:
    config["hidden-gpu:nodes"].append(
        {"name": "gpu-node-03", "exposedGpus": ["GPU-0c0c0c0c-1111-4222-8333-444455556666"], "hiddenGpus": []}
    )


def test_an_added_node_shows_its_uuids_and_the_exit_code_gates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = render_to(tmp_path, "base", valid_config())
    head = render_to(tmp_path, "head", changed(with_third_node))
    capsys.readouterr()
    assert diff.main([str(base), str(head), "--exit-code"]) == 1
    out = capsys.readouterr().out
    assert "+ added   daemonset.hidden-gpu-system.nvidia-device-plugin-gpu-node-03.yaml" in out
    assert "    node gpu-node-03 exposes GPU-0c0c0c0c-1111-4222-8333-444455556666" in out
    assert diff.main([str(base), str(base), "--exit-code"]) == 0


# --- 6. Fail closed ---


def test_node_label_patches_the_namespace_and_the_guard_are_retained_on_delete() -> None:
    run = run_program(changed(lambda c: c.__setitem__("hidden-gpu:guard", {"addVoid": True})), "test")
    assert all(patch.retain_on_delete for patch in run.of_type(Token.NODE_PATCH))
    assert only(run.of_type(Token.NAMESPACE)).retain_on_delete
    # Shared by every stack of the cluster (offline.fleet: one plugin namespace per cluster).
    networks = run.of_type(Token.NETWORK_POLICY)
    assert len(networks) == 2 and all(network.retain_on_delete for network in networks)
    guard = [r for r in run.resources if r.parent == only(run.of_type(Token.ACCESS_GUARD)).urn]
    assert len(guard) == 10 and all(r.retain_on_delete for r in guard)
    # A later `up` takes the retained objects back under one well-known field manager, forcing.
    for retained in [*guard, *run.of_type(Token.NODE_PATCH), *networks]:
        annotations = retained.inputs["metadata"]["annotations"]
        assert annotations["pulumi.com/patchFieldManager"] == "hidden-gpu", retained.name
        assert annotations["pulumi.com/patchForce"] == "true", retained.name


def test_a_node_leaving_the_stack_is_flagged_in_review(tmp_path: Path) -> None:
    base = render_to(tmp_path, "base", valid_config())
    head = render_to(tmp_path, "head", changed(lambda c: c["hidden-gpu:nodes"].pop(1)))
    assert diff.diff(base, head).splitlines() == [
        "! node gpu-node-02: GPU-c0ffee00-1111-4222-8333-444455556666 hidden -> (not listed)",
        "! node gpu-node-02: GPU-deadbeef-7777-4888-9999-aaaabbbbcccc hidden -> (not listed)",
        "  GPUs before -> after, in the base's stack order (■ exposed, □ hidden, · not listed):",
        "    gpu-node-02  □□ -> ··",
        "~ changed configmap.hidden-gpu-system.hidden-gpu-stack-case.yaml",
        "    data.node.gpu-node-02: '' -> (absent)",
        "- removed nodepatch.gpu-node-02.yaml",
        "    ! node gpu-node-02 leaves the stack: its labels stay on the node (retained), so it stays hidden",
    ]


@pytest.mark.parametrize("namespace", ["kube-system", "default", "gpu-operator"])
def test_namespaces_the_cluster_owns_are_never_created(
    namespace: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = changed(lambda c: c["hidden-gpu:devicePlugin"].update({"namespace": namespace}))
    assert render.main(["--stack-file", str(write_stack(tmp_path, config)), "--out", str(tmp_path / "o")]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith(
        f"error: {tmp_path / 'Pulumi.case.yaml'}:19: hidden-gpu:devicePlugin.createNamespace = true: namespace {namespace}"
    )
    reused = changed(lambda c: c["hidden-gpu:devicePlugin"].update({"namespace": namespace, "createNamespace": False}))
    assert only(plugins(run_program(reused, "test"))).inputs["metadata"]["namespace"] == namespace
    assert DEFAULT_PLUGIN_NAMESPACE not in (namespace,)


# --- 7. Crashes are not findings: the reliability cases, each one line, not 1, at once (an expansion takes minutes) ---

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(9)
)
RELIABILITY: dict[str, tuple[bytes, str]] = {
    "non-utf8": (
        b"config:\n" + CLUSTER_YAML.encode() + b"  hidden-gpu:nodes: [{name: \xff\xfe}]\n",
        "Pulumi.r.yaml:4: not UTF-8 text (byte 118)",
    ),
    "on-key": (
        b"config:\n" + CLUSTER_YAML.encode() + b"  hidden-gpu:nodes: [{name: n, exposedGpus: []}]\n  on: true\n",
        "hidden-gpu:on = true: unknown key",
    ),
    "number-key": (
        b"config:\n" + CLUSTER_YAML.encode() + b"  hidden-gpu:nodes: [{name: n, exposedGpus: []}]\n  7: true\n",
        "config key 7 is not a string",
    ),
    "deep-list": (b"config:\n  other:deep: " + b"[" * 1000 + b"]" * 1000 + b"\n", "nested deeper than 32 levels"),
    "yaml-date": (
        b"config:\n"
        + CLUSTER_YAML.encode()
        + b"  hidden-gpu:nodes: [{name: n, exposedGpus: []}]\n  other:since: 2024-01-01\n",
        "",
    ),
    "alias-bomb": (
        ("config:\n  other:bomb:\n" + "".join("    " + line + "\n" for line in BOMB.splitlines())).encode(),
        "expands to more than",
    ),
    "not-a-mapping": (b"- just\n- a list\n", "has no 'config:' mapping"),
    "empty": (b"", "is empty"),
}


@pytest.mark.parametrize("case", RELIABILITY, ids=list(RELIABILITY))
def test_reliability_cases_end_in_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, reason = RELIABILITY[case]
    path = tmp_path / "Pulumi.r.yaml"
    path.write_bytes(data)
    start = time.perf_counter()
    status = render.main(["--stack-file", str(path), "--out", str(tmp_path / "o")])
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    if case == "yaml-date":  # another namespace's date is that namespace's business: the stack renders
        assert status == 0 and err == ""
        return
    # Refused before the program runs, whatever the input costs; 5 s leaves room for a loaded runner.
    assert seconds < 5.0
    assert status == EXIT_USAGE and err.count("\n") == 1 and reason in err, err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


def test_on_as_a_key_is_a_string_key_under_yaml_1_2(tmp_path: Path) -> None:
    """Pulumi's yaml.v3 reads `on:` as the string "on"; so does the reader (no YAML 1.1 True key)."""
    path = tmp_path / "Pulumi.on.yaml"
    path.write_text("config:\n" + CLUSTER_YAML + "  hidden-gpu:nodes: [{name: n, exposedGpus: []}]\n  on:thing: 1\n")
    assert render.main(["--stack-file", str(path), "--out", str(tmp_path / "o")]) == 0


def test_a_bad_value_is_shown_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = changed(lambda c: node(c).__setitem__("name", "x" * 10_000))
    assert render.main(["--stack-file", str(write_stack(tmp_path, config)), "--out", str(tmp_path / "o")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 400


def test_an_unexpected_error_is_not_a_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(render, "run_program", broken)
    status = render.main(["--stack-file", str(write_stack(tmp_path, valid_config())), "--out", str(tmp_path / "o")])
    assert status == EXIT_INTERNAL not in (0, 1)
    assert (
        capsys.readouterr().err == "error: internal error: ZeroDivisionError: division by zero (--debug shows where)\n"
    )


# --- 5. Clean exits ---


def test_a_run_leaves_no_event_loop_open() -> None:
    """The stray `BaseEventLoop.__del__ ... Invalid file descriptor` at exit came from loops the mock
    monitor's threads made and nobody closed; every loop of a run is closed when it ends."""
    run_program(valid_config(), "test")
    gc.collect()
    open_loops = [o for o in gc.get_objects() if isinstance(o, asyncio.BaseEventLoop) and not o.is_closed()]
    assert open_loops == []


@pytest.mark.subprocess
@pytest.mark.slow
def test_repeated_renders_print_nothing_on_stderr(tmp_path: Path) -> None:
    for attempt in range(12):
        result = subprocess.run(
            [sys.executable, "-m", "offline.render", "--stack", "prod", "--out", str(tmp_path / "o")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert (result.returncode, result.stderr) == (0, ""), f"run {attempt}: {result.stderr}"
    assert yaml.safe_load((tmp_path / "o" / "namespace.hidden-gpu-system.yaml").read_text())["kind"] == "Namespace"
