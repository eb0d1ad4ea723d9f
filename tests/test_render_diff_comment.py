"""The pull request's render comment (scripts/render_diff.sh, posted by preview.yml): besides the diff, each
stack's GPUs per node as the change renders them, one mark per GPU, from offline.render's own summary: a reviewer
of a UUID move sees the marks, not UUIDs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXPOSED_1 = "GPU-1cfac13b-6d1e-46f0-8a35-dec1881f60dc"
HIDDEN_1 = "GPU-607fa717-22a4-4c6f-98d1-2f2491df3dbe"


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_comment_shows_each_nodes_gpus_after_the_change(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    (clone / ".venv").symlink_to(ROOT / ".venv")
    prod = clone / "stacks" / "Pulumi.prod.yaml"
    # Swap the second exposed GPU of gpu-node-01 with its second hidden one.
    text = prod.read_text().replace(EXPOSED_1, "SWAP").replace(HIDDEN_1, EXPOSED_1).replace("SWAP", HIDDEN_1)
    prod.write_text(text)
    comment = subprocess.run(
        [str(ROOT / "scripts" / "render_diff.sh"), "HEAD"], cwd=clone, capture_output=True, text=True, check=True
    ).stdout
    prod_part = comment[comment.index("**stack `prod`**") :]
    assert f"! node gpu-node-01: {EXPOSED_1} exposed -> hidden" in prod_part
    assert "    gpu-node-01  ■■□□□□□□ -> ■□□■□□□□\n" in prod_part  # the diff's own map, in the base's order
    map_block = prod_part[prod_part.index("GPUs per node with this change") :]
    # issue 42, 5: the comment said "written to render/prod", a directory of the CI runner's, gone with it.
    assert "```text\nstack prod: " in map_block and " objects with this change\n" in map_block
    assert "written to" not in comment
    assert "    gpu-node-01  ■■□□□□□□\n" in map_block  # the change's own stack order: its exposed GPUs first
    assert "    gpu-node-02  □□□□□□□□\n" in map_block
    dev_part = comment[comment.index("**stack `dev`**") : comment.index("**stack `prod`**")]
    assert "no changes" in dev_part and "    dgx-dev-01  ■□□□□□□□\n" in dev_part
