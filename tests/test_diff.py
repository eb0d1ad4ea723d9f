"""offline.diff: what a reviewer sees for a change to a stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from common.names import GRAPH_FILE
from offline import diff, render
from tests.support.stacks import EXPOSED, HIDDEN, changed, node, valid_config

OTHER = "GPU-0c0c0c0c-1111-4222-8333-444455556666"
MAP_HEADER = "  GPUs before -> after, in the base's stack order (■ exposed, □ hidden, · not listed):"


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
        f"! node gpu-node-01: {EXPOSED} exposed -> hidden",
        f"! node gpu-node-01: {HIDDEN[0]} hidden -> exposed",
        MAP_HEADER,
        "    gpu-node-01  ■□□ -> □■□",  # a swap: the counts stay, two marks change places
        "~ changed configmap.hidden-gpu-system.hidden-gpu-stack-case.yaml",
        f"    data.node.gpu-node-01: {EXPOSED} -> {HIDDEN[0]}",
        "~ changed daemonset.hidden-gpu-system.dcgm-exporter-gpu-node-01.yaml",
        f"    spec.template.spec.containers[dcgm-exporter].env[NVIDIA_VISIBLE_DEVICES].value: {EXPOSED} -> {HIDDEN[0]}",
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
    head = render_config(tmp_path, "head", changed(lambda c: node(c).__setitem__("operands", {"migManager": True})))
    assert diff.diff(base, head).splitlines() == [
        "~ changed nodepatch.gpu-node-01.yaml",
        "    metadata.annotations.hidden-gpu.io/operands-off:"
        " device-plugin,gpu-feature-discovery,mig-manager,dcgm,dcgm-exporter"
        " -> device-plugin,gpu-feature-discovery,dcgm,dcgm-exporter",
        "    metadata.labels.nvidia.com/gpu.deploy.mig-manager: 'false' -> (absent)",
    ]


def test_a_hidden_uuid_change_shows(tmp_path: Path) -> None:
    """A hidden GPU is in no Kubernetes object; the review still sees it replaced, one line per UUID."""
    base = render_config(tmp_path, "base", valid_config())
    replaced = changed(lambda c: node(c).update({"hiddenGpus": [OTHER, HIDDEN[1]]}))
    assert diff.diff(base, render_config(tmp_path, "head", replaced)).splitlines() == [
        f"! node gpu-node-01: {OTHER} (not listed) -> hidden",
        f"! node gpu-node-01: {HIDDEN[0]} hidden -> (not listed)",
        MAP_HEADER,
        "    gpu-node-01  ■□□· -> ■·□□",
    ]


def _rename(render_dir: Path, file: str, alias: bool) -> str:
    """The render as if the object in `file` were declared under another name (with an alias or without)."""
    graph_path = render_dir / GRAPH_FILE
    graph = json.loads(graph_path.read_text())
    entry = next(r for r in graph["resources"] if r.get("file") == file)
    old: str = entry["urn"]
    entry["urn"] = old + "-renamed"
    if alias:
        entry["aliases"] = [*entry.get("aliases", []), old]
    graph_path.write_text(json.dumps(graph))
    return old


@pytest.mark.parametrize("alias", [False, True], ids=["without-alias", "with-alias"])
def test_a_renamed_child_shows_first(alias: bool, tmp_path: Path) -> None:
    """Byte-identical objects, another URN: without an alias Pulumi deletes and recreates the node's patch."""
    base = render_config(tmp_path, "base", valid_config())
    head = render_config(tmp_path, "head", valid_config())
    _rename(head, "nodepatch.gpu-node-01.yaml", alias)
    (line,) = diff.diff(base, head).splitlines()
    if alias:
        assert line.startswith("  nodepatch.gpu-node-01.yaml: renamed ") and line.endswith(
            "with an alias: Pulumi keeps the object"
        )
    else:
        assert line.startswith("! nodepatch.gpu-node-01.yaml: renamed ") and "without an alias: Pulumi deletes" in line


def test_a_dropped_retain_on_delete_shows(tmp_path: Path) -> None:
    base = render_config(tmp_path, "base", valid_config())
    head = render_config(tmp_path, "head", valid_config())
    graph = json.loads((head / GRAPH_FILE).read_text())
    next(r for r in graph["resources"] if r.get("file") == "nodepatch.gpu-node-02.yaml")["retainOnDelete"] = False
    (head / GRAPH_FILE).write_text(json.dumps(graph))
    assert diff.diff(base, head).splitlines() == ["! nodepatch.gpu-node-02.yaml: retainOnDelete true -> false"]


def test_a_render_from_before_the_graph_is_compared_by_objects_only(tmp_path: Path) -> None:
    """The first review after the graph came compares with a base rendered without one: no flood of
    'not listed' lines, one note."""
    base = render_config(tmp_path, "base", valid_config())
    head = render_config(tmp_path, "head", valid_config())
    (base / GRAPH_FILE).unlink()
    assert diff.diff(base, head) == f"  (base render has no {GRAPH_FILE}: identity not compared)"
