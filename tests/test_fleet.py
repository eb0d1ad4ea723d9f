"""offline.fleet: the checks across stack files (one GPU, one stack; one node of a cluster, one stack; one guard
per cluster, declared alike)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from common.cli import EXIT_FINDING, EXIT_OK, EXIT_USAGE, stack_files
from offline import fleet, render
from tests.support.stacks import HIDDEN, changed, node, valid_config, write_stack


def test_the_projects_stacks_do_not_conflict(capsys: pytest.CaptureFixture[str]) -> None:
    assert fleet.main([]) == EXIT_OK
    assert capsys.readouterr().out.endswith(" conflict(s)\n")


def test_a_gpu_one_stack_hides_and_another_exposes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both stacks render, both pass discover --check: only together do they show the GPU handed out."""
    write_stack(tmp_path, valid_config(), "a")
    other = changed(lambda c: node(c).update({"name": "gpu-node-07", "exposedGpus": [HIDDEN[0]], "hiddenGpus": []}))
    other["kubernetes:context"] = "admin@other"
    other["hidden-gpu:nodes"] = other["hidden-gpu:nodes"][:1]
    write_stack(tmp_path, other, "b")
    assert fleet.main(["--stacks-dir", str(tmp_path)]) == EXIT_FINDING
    assert capsys.readouterr().out.splitlines() == [
        f"conflict: GPU {HIDDEN[0]}: listed by Pulumi.a.yaml and Pulumi.b.yaml",
        "2 stack files, 1 conflict(s)",
    ]


def test_one_node_of_one_cluster_in_two_stacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_stack(tmp_path, changed(lambda c: c["hidden-gpu:nodes"].pop(1)), "a")
    write_stack(tmp_path, changed(lambda c: c["hidden-gpu:nodes"].pop(0)), "b")
    b = changed(lambda c: c["hidden-gpu:nodes"].pop(1))
    node(b).update({"exposedGpus": [], "hiddenGpus": ["GPU-0c0c0c0c-1111-4222-8333-444455556666"]})
    write_stack(tmp_path, b, "c")
    assert fleet.main(["--stacks-dir", str(tmp_path)]) == EXIT_FINDING
    assert "conflict: node gpu-node-01 of cluster 'admin@test': listed by Pulumi.a.yaml and Pulumi.c.yaml" in (
        capsys.readouterr().out
    )


def test_the_same_node_name_in_two_clusters_is_fine(tmp_path: Path) -> None:
    write_stack(tmp_path, changed(lambda c: c["hidden-gpu:nodes"].pop(1)), "a")
    b = changed(lambda c: c["hidden-gpu:nodes"].pop(1)) | {"kubernetes:context": "admin@elsewhere"}
    node(b).update({"exposedGpus": ["GPU-0c0c0c0c-1111-4222-8333-444455556666"], "hiddenGpus": []})
    write_stack(tmp_path, b, "b")
    assert fleet.main(["--stacks-dir", str(tmp_path)]) == EXIT_OK


def test_an_invalid_stack_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in stack_files():
        shutil.copy(path, tmp_path)
    (tmp_path / "Pulumi.broken.yaml").write_text("config: [\n")
    assert fleet.main(["--stacks-dir", str(tmp_path)]) == EXIT_USAGE
    assert "Pulumi.broken.yaml" in capsys.readouterr().err


def test_a_conflict_lists_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The workflows run over the list: a conflicting pair must stop them, not run."""
    write_stack(tmp_path, valid_config(), "a")
    write_stack(tmp_path, valid_config(), "b")
    assert fleet.main(["--stacks-dir", str(tmp_path), "--list"]) == EXIT_FINDING
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("conflict: GPU ")


def test_adding_an_environment_is_its_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/operations.md, "Adding an environment": a staging stack between dev and prod, with its own cluster
    and GPUs, joins the list in its wave and renders; nothing else changes."""
    for path in stack_files():
        shutil.copy(path, tmp_path)
    staging = changed(lambda c: c.update({"kubernetes:context": "admin@staging", "hidden-gpu:rolloutWave": 1}))
    write_stack(tmp_path, staging, "staging")
    assert fleet.main(["--stacks-dir", str(tmp_path), "--list"]) == EXIT_OK
    names = json.loads(capsys.readouterr().out)
    assert names.index("dev") < names.index("staging") < names.index("prod")
    for name in names:
        out = tmp_path / "render" / name
        assert render.main(["--stack-file", str(tmp_path / f"Pulumi.{name}.yaml"), "--out", str(out)]) == EXIT_OK
    assert "stack staging:" in capsys.readouterr().out


def test_stacks_sharing_a_cluster_share_its_guard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One guard per cluster (its policies have one name in every stack): a second stack with another plugin
    namespace would rewrite the first one's exemption at its `up`, and the first one's plugin pods be denied."""
    write_stack(tmp_path, changed(lambda c: c["hidden-gpu:nodes"].pop(1)), "a")
    b = changed(lambda c: c["hidden-gpu:nodes"].pop(0))
    b["hidden-gpu:devicePlugin"] = {**b.get("hidden-gpu:devicePlugin", {}), "namespace": "other-gpu-system"}
    write_stack(tmp_path, b, "b")
    assert fleet.main(["--stacks-dir", str(tmp_path)]) == EXIT_FINDING
    out = capsys.readouterr().out
    assert (
        "conflict: the guard of cluster 'admin@test' (one per cluster: guard settings and devicePlugin.namespace): "
        "declared differently by Pulumi.a.yaml and Pulumi.b.yaml"
    ) in out


def test_stacks_sharing_a_cluster_declare_each_quota_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_stack(tmp_path, changed(lambda c: c["hidden-gpu:nodes"].pop(1)), "a")
    write_stack(tmp_path, changed(lambda c: c["hidden-gpu:nodes"].pop(0)), "b")
    assert fleet.main(["--stacks-dir", str(tmp_path)]) == EXIT_FINDING
    quotas = valid_config()["hidden-gpu:quotas"]
    assert quotas, "the fixture stack sets quotas"
    out = capsys.readouterr().out
    for namespace in quotas:
        assert (
            f"conflict: the GPU quota of namespace {namespace} of cluster 'admin@test': "
            "declared by Pulumi.a.yaml and Pulumi.b.yaml"
        ) in out
    assert "the guard of cluster" not in out  # the same guard settings: one guard, declared alike


def test_stacks_sharing_a_cluster_without_shared_objects_pass(tmp_path: Path) -> None:
    write_stack(tmp_path, changed(lambda c: c["hidden-gpu:nodes"].pop(1)), "a")
    b = changed(lambda c: c["hidden-gpu:nodes"].pop(0))
    del b["hidden-gpu:quotas"]
    write_stack(tmp_path, b, "b")
    assert fleet.main(["--stacks-dir", str(tmp_path)]) == EXIT_OK
