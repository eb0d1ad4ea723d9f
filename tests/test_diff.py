"""offline.diff: what a reviewer sees for a change to a stack."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from offline import diff, render
from tests.support.stacks import EXPOSED, HIDDEN, changed, node, valid_config


def render_config(tmp_path: Path, name: str, config: dict[str, object]) -> Path:
    """Stack `case` as `config` has it, rendered into tmp_path/name: a review compares one stack's two renders."""
    (tmp_path / f"{name}-stack").mkdir()
    stack_file = tmp_path / f"{name}-stack" / "Pulumi.case.yaml"
    stack_file.write_text(yaml.safe_dump({"config": config}))
    out = tmp_path / name
    assert render.main(["--stack-file", str(stack_file), "--out", str(out)]) == 0
    return out


def test_one_uuid_change_names_the_object_and_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = render_config(tmp_path, "base", valid_config())
    swapped = changed(lambda c: node(c).update({"exposedGpus": [HIDDEN[0]], "hiddenGpus": [EXPOSED, HIDDEN[1]]}))
    head = render_config(tmp_path, "head", swapped)
    capsys.readouterr()
    assert diff.main([str(base), str(head)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "~ changed configmap.hidden-gpu-system.hidden-gpu-stack-case.yaml",
        f"    data.node.gpu-node-01: {EXPOSED} -> {HIDDEN[0]}",
        "~ changed daemonset.hidden-gpu-system.nvidia-device-plugin-gpu-node-01.yaml",
        "    spec.template.spec.containers[nvidia-device-plugin].env[NVIDIA_VISIBLE_DEVICES].value: "
        f"{EXPOSED} -> {HIDDEN[0]}",
    ]


def test_added_and_removed_objects(tmp_path: Path) -> None:
    base = render_config(tmp_path, "base", valid_config())
    head = render_config(tmp_path, "head", changed(lambda c: c.__setitem__("hidden-gpu:quotas", {"ml-ops": 2})))
    assert diff.diff(base, head).splitlines() == [
        "+ added   resourcequota.ml-ops.hidden-gpu-quota.yaml",
        "- removed resourcequota.ml-team.hidden-gpu-quota.yaml",
    ]


def test_new_field_and_identical_renders(tmp_path: Path) -> None:
    base = render_config(tmp_path, "base", valid_config())
    assert diff.diff(base, base) == "no changes"
    head = render_config(
        tmp_path, "head", changed(lambda c: node(c).__setitem__("operands", {"gpuFeatureDiscovery": True}))
    )
    assert diff.diff(base, head).splitlines() == [
        "~ changed nodepatch.gpu-node-01.yaml",
        "    metadata.labels.nvidia.com/gpu.deploy.gpu-feature-discovery: 'false' -> (absent)",
    ]
