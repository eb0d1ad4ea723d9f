"""The docs match the code: the generated reference is current, commands shown exist, links resolve."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import subprocess
from pathlib import Path

import pytest

from common.cli import UsageError
from offline import config_reference

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_configuration_reference_is_generated_from_the_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert config_reference.main(["--check"]) == 0, capsys.readouterr().err
    assert (ROOT / "docs" / "configuration.md").read_text() == config_reference.reference()


def test_every_key_of_the_models_is_documented() -> None:
    text = config_reference.reference()
    for key in ("hidden-gpu:nodes[].exposedGpus", "hidden-gpu:guard.mode", "hidden-gpu:nodes[].timeSlicing.replicas"):
        assert f"`{key}`" in text
    undocumented = [row for row in text.splitlines() if row.startswith("| `") and row.rstrip().endswith("|  |")]
    assert undocumented == []


def test_a_stale_reference_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(config_reference.reference().replace("at least one", "one or more"))
    monkeypatch.setattr(config_reference, "DOC", stale)
    assert config_reference.main(["--check"]) == 1


def test_the_writer_refuses_a_file_it_did_not_generate(tmp_path: Path) -> None:
    handwritten = tmp_path / "configuration.md"
    handwritten.write_text("# my notes\n")
    with pytest.raises(UsageError, match="was not generated"):
        config_reference.write(handwritten, "new")
    assert handwritten.read_text() == "# my notes\n"


def test_the_readmes_render_output_is_what_make_render_prints(tmp_path: Path) -> None:
    """README's first command, and what it says it prints, for the stack it names."""
    from offline import render  # noqa: PLC0415 (the one docs test that renders)

    shown = (ROOT / "README.md").read_text().split("stack prod: ", 1)[1].split("```", 1)[0]
    printed = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # a terminal's: the GPU map's own characters
    with contextlib.redirect_stdout(printed):
        assert render.main(["--stack", "prod", "--out", str(tmp_path / "prod")]) == 0
    printed.seek(0)
    assert printed.read().replace(str(tmp_path / "prod"), "render/prod") == f"stack prod: {shown}"


def test_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_commands_shown_name_modules_that_exist(doc: Path) -> None:
    for module in re.findall(r"python3? -m ([a-z_]+(?:\.[a-z_]+)+)", doc.read_text()):
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), f"{doc.name}: python -m {module}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_and_paths_resolve(doc: Path) -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", doc.read_text()):
        if "://" not in target:
            assert (doc.parent / target).exists(), f"{doc.name}: {target}"
    for path in re.findall(
        r"`((?:docs|scripts|stacks|policy|offline|host|cluster|common|components|stack_config)/[\w./-]+)`",
        doc.read_text(),
    ):
        if "<" not in path and "*" not in path:
            assert (ROOT / path).exists(), f"{doc.name}: {path}"


COMMAND = re.compile(r"python3? -m ((?:offline|cluster|host|e2e)\.[a-z_]+)([^`#\n]*)")


def _help(module: str) -> str:
    """What `python -m module --help` prints: every flag the tool takes."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        importlib.import_module(module).main(["--help"])
    return out.getvalue()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_flag_the_docs_show_exists(doc: Path) -> None:
    """`python -m host.audit --stack-file ... --watch`: each --flag is one the tool's parser takes."""
    helps: dict[str, str] = {}
    for module, rest in COMMAND.findall(doc.read_text()):
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest):
            text = helps.setdefault(module, _help(module))
            assert re.search(rf"(?<![\w-]){flag}(?![\w-])", text), f"{doc.name}: python -m {module} {flag}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_make_target_the_docs_show_exists(doc: Path) -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    for target in re.findall(r"`make ([a-z][\w-]*)", doc.read_text()):
        assert target in targets, f"{doc.name}: make {target}"


def test_the_flag_check_can_fail() -> None:
    assert not re.search(r"(?<![\w-])--no-such-flag(?![\w-])", _help("offline.render"))


RELEASE_STEP = "cluster.release to the operator's plugin pod on the node"


def test_the_operator_figures_are_the_records() -> None:
    """docs/performance.md's GPU Operator figures are those of docs/measurements/gpu-operator-2core.json."""
    record = json.loads((ROOT / "docs/measurements/gpu-operator-2core.json").read_text())
    section = (
        (ROOT / "docs/performance.md").read_text().split("## Beside the real GPU Operator", 1)[1].split("\n## ")[0]
    )
    seconds = record["real_tier"]["seconds"]
    runs = record["node_tier"]["runs"]
    figures = [
        f"| {seconds['operator process to its readiness probe']} ({seconds['operator restart to its readiness probe']}) |",
        f"| {seconds['pulumi up, two nodes hidden beside the operator']} |",
        f"| {seconds[RELEASE_STEP]} |",
        "| "
        + ", ".join(str(r["up_to_exposed_alone_s"]) for r in sorted(runs, key=lambda r: r["up_to_exposed_alone_s"])),
        "| "
        + ", ".join(
            f"{r['old_stream_end_to_pinned_registration_s']:.2f}"
            for r in sorted(runs, key=lambda r: r["old_stream_end_to_pinned_registration_s"])
        ),
        "| "
        + ", ".join(str(r["release_to_all_gpus_s"]) for r in sorted(runs, key=lambda r: r["release_to_all_gpus_s"])),
        f"{record['build']['gpuoperator_binary_mb']} MB stripped) took {record['build']['cold_seconds']['gpuoperator']} s",
    ]
    for figure in figures:
        assert figure in section, figure


def test_the_admission_comparison_table_is_the_record() -> None:
    """docs/performance.md's comparison with Pod Security and the floor is the table lab.admission_compare makes
    from docs/measurements/admission-compare-2core.json."""
    from lab.admission_compare import table  # noqa: PLC0415 (the benchmark's module, only for this test)

    record = json.loads((ROOT / "docs/measurements/admission-compare-2core.json").read_text())
    assert table(record["summary"]) in (ROOT / "docs/performance.md").read_text()


TIMES, MINUS_SIGN = "\u00d7", "\u2212"  # as docs/performance.md writes them


def test_the_admission_comparisons_prose_is_the_record() -> None:
    """The figures the bullets under the comparison table state (growth per container, what the fast path bought,
    the scope's and the goals' ratios) are the record's, rounded as written: they cannot drift from the table."""
    summary = json.loads((ROOT / "docs/measurements/admission-compare-2core.json").read_text())["summary"]
    rows, growth = summary["bySize"], summary["growthUsPerContainer"]
    text = " ".join((ROOT / "docs/performance.md").read_text().split("- **Growth**", 1)[1].split("### ")[0].split())

    def ratio(n: str, mine: str, other: str) -> float:
        return float(rows[n][mine]["costMs"] / rows[n][other]["costMs"])

    def saving(n: str) -> str:
        return f"{round(100 * rows[n]['ratios']['fastPathSaving'])} %"

    scoped = sorted(rows[n]["ratios"]["scopedOutsideOverFloor"] for n in rows)
    figures = [
        f"{growth['guard']:.0f} µs per container for the guard",
        f"{growth['per-rule']:.0f} µs without its fast path",
        f"it bought {saving('16')} at 16 containers, {saving('64')} at 64 and {saving('256')} at 256",
        f"(+{saving('1')} and {saving('4').replace('-', MINUS_SIGN)})",
        f"cost {scoped[0]:.1f}{TIMES} to {scoped[-1]:.1f}{TIMES} the floor",
        f"({ratio('64', 'scoped', 'restricted'):.1f}{TIMES}, goal 15{TIMES})",
        f"it is {ratio('1', 'scoped', 'restricted'):.1f}{TIMES} `restricted`",
        f"from Pod Security ({ratio('1', 'floor', 'restricted'):.1f}{TIMES})",
        f"the guard is {rows['1']['ratios']['guardOverFloor']:.1f}{TIMES} the floor",
        f"and {rows['1']['ratios']['guardOverRestricted']:.0f}{TIMES} `restricted` (goal 6{TIMES})",
        f"at 64 containers {rows['64']['ratios']['guardOverFloor']:.0f}{TIMES} the floor",
        f"and {rows['64']['ratios']['guardOverRestricted']:.0f}{TIMES} `restricted` (goal 15{TIMES}); {growth['guard']:.0f} µs",
    ]
    for figure in figures:
        assert figure in text, figure


def test_the_cost_limit_figures_are_the_record() -> None:
    """docs/performance.md's CEL cost-limit figures are docs/measurements/admission-cost-limit-2core.json's."""
    record = json.loads((ROOT / "docs/measurements/admission-cost-limit-2core.json").read_text())
    text = " ".join(
        (ROOT / "docs/performance.md").read_text().split("**The CEL cost limit**", 1)[1].split("- **")[0].split()
    )
    for config, key in (("guard", "small, admitted"), ("guard", "small, denied at the last container"),
                        ("guard", "padded, admitted"), ("per-rule", "small, denied at the last container")):  # fmt: skip
        assert f"{record[config][key]['largestJudged']:,}" in text, (config, key)


def test_the_cold_ci_table_is_the_records() -> None:
    """docs/performance.md states the cold CI runs' figures once: the table lab.cold_ci makes of their records."""
    from lab.cold_ci import runs, table  # noqa: PLC0415 (the lab's module, only for this test)

    assert table(runs()) in (ROOT / "docs/performance.md").read_text()


def test_the_readme_maps_every_top_level_folder() -> None:
    """issue 39: the README's "Where things are" names every folder git tracks at the top."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    folders = {name.split("/", 1)[0] for name in tracked.splitlines() if "/" in name and not name.startswith(".")}
    table = (ROOT / "README.md").read_text().split("## Where things are", 1)[1].split("\n\n", 2)[1]
    assert {f for f in folders if f"`{f}/`" not in table} == set()
