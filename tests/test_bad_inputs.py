"""Bad input for every tool, as an operator types it (issue 33): each ends in 0, 1, 2 or 3 with at most one
`error:` line, never 4 (a bug), a traceback, a hang or a pass that checked nothing. A corpus of the inputs a
reliability run found, then generated ones (their full count under `make test-all`). Ctrl-C while a tool starts is
tests/test_ctrl_c.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster import release, verify
from common.cli import EXIT_CLOSED_PIPE, EXIT_USAGE, UsageError
from host import audit, discover
from offline import diff, fleet, render
from tests.support.examples import examples
from tests.support.stacks import EXPOSED, HIDDEN, valid_config, write_stack

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "examples" / "host-record.json"
STATUSES = {0, 1, 2, 3}
# No bad input may take longer than this in-process (pytest-timeout fails a hang instead of holding CI).
SECONDS = 30

# Lines spliced under `config:` of a valid stack file, outside our namespace (every tool reads the whole file).
BAD_STACK_LINES = {
    "5000-digit-integer": "  other:big: " + "9" * 5000,
    "self-referencing-alias": "  other:loop: &loop [1, *loop]",
    "lone-surrogate": '  other:s: "\\ud800"',
    "alias-chain-deeper-than-32": "  other:k0: &a0 [1]\n"
    + "\n".join(f"  other:k{i}: &a{i} [*a{i - 1}]" for i in range(1, 40)),
    "deep-flow": "  other:deep: " + "[" * 5000 + "]" * 5000,
}


def stack_text(extra: str) -> str:
    text = write_stack_text()
    return text.replace("config:\n", f"config:\n{extra}\n", 1)


def write_stack_text() -> str:
    import yaml  # noqa: PLC0415

    return yaml.safe_dump({"config": valid_config()}, sort_keys=False)


def kubeconfig(tmp_path: Path, user: str = "{token: t}") -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        'clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]\n'
        f"users: [{{name: u, user: {user}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n"
    )
    return path


# Each tool that reads a stack file, as a command line for the file at `path` (tmp_path: scratch).
STACK_READERS: dict[str, Callable[[Path, Path], tuple[Callable[[list[str]], int], list[str]]]] = {
    "render": lambda path, tmp: (render.main, ["--stack-file", str(path), "--out", str(tmp / "out")]),
    "discover": lambda path, tmp: (
        discover.main,
        ["--record", str(RECORD), "--check", "--stack-file", str(path), "--node", "gpu-node-01"],
    ),
    "audit": lambda path, tmp: (
        audit.main,
        ["--stack-file", str(path), "--node", "gpu-node-01", "--record", str(RECORD), "--proc-root", str(tmp)],
    ),
    "fleet": lambda path, tmp: (fleet.main, ["--stacks-dir", str(path.parent)]),
    "verify": lambda path, tmp: (
        verify.main,
        ["--stack-file", str(path), "--kubeconfig", str(kubeconfig(tmp)), "--deadline", "5"],
    ),
    "release": lambda path, tmp: (
        release.main,
        ["--stack-file", str(path), "--node", "gone", "--kubeconfig", str(kubeconfig(tmp)), "--deadline", "5"],
    ),
}


def call(command: Callable[[list[str]], int], argv: list[str]) -> int:
    """A tool's status, whether it returns it or argparse exits with it."""
    try:
        return command(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else -1


def judged(status: int, err: str, *, expected: set[int] = STATUSES) -> None:
    assert status in expected, err
    assert "internal error" not in err and "Traceback" not in err, err
    lines = err.splitlines()
    # One line per problem (the README's contract): two bad values of one file are two lines, never one repeated.
    assert len(lines) == len(set(lines)), err
    assert all(line.startswith("error: ") for line in lines), err


def stack_dir(tmp_path: Path, text: str) -> Path:
    directory = tmp_path / "stacks"
    directory.mkdir()
    path = directory / "Pulumi.case.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


@pytest.mark.timeout(SECONDS)
@pytest.mark.parametrize("tool", sorted(STACK_READERS))
@pytest.mark.parametrize("case", sorted(BAD_STACK_LINES))
def test_a_bad_stack_file_is_one_line_and_2_for_every_tool(
    tool: str, case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = stack_dir(tmp_path, stack_text(BAD_STACK_LINES[case]))
    command, argv = STACK_READERS[tool](path, tmp_path)
    status = call(command, argv)
    err = capsys.readouterr().err
    judged(status, err, expected={EXIT_USAGE})
    assert "Pulumi.case.yaml" in err


@pytest.mark.timeout(SECONDS)
@pytest.mark.parametrize("tool", sorted(STACK_READERS))
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_stack_file_that_is_no_file_is_refused_before_reading(
    tool: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "stacks"
    directory.mkdir()
    path = directory / "Pulumi.case.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    command, argv = STACK_READERS[tool](path, tmp_path)
    status = call(command, argv)
    err = capsys.readouterr().err
    judged(status, err, expected={EXIT_USAGE})
    assert "not a regular file" in err


def rendered(tmp_path: Path) -> Path:
    out = tmp_path / "base"
    assert render.main(["--stack-file", str(write_stack(tmp_path, valid_config())), "--out", str(out)]) == 0
    return out


def in_render(name: str, make: Callable[[Path], object]) -> Callable[[Path], None]:
    def change(directory: Path) -> None:
        target = directory / name
        target.unlink(missing_ok=True)
        make(target)

    return change


RENDER_DAMAGE: dict[str, Callable[[Path], None]] = {
    "fifo": in_render("x.yaml", os.mkfifo),
    "link-to-dev-zero": in_render("x.yaml", lambda p: p.symlink_to("/dev/zero")),
    "fifo-graph": in_render("_pulumi-graph.json", os.mkfifo),
    "deep-yaml": in_render("x.yaml", lambda p: p.write_text("a: " + "[" * 50_000 + "]" * 50_000)),
    "deep-graph": in_render("_pulumi-graph.json", lambda p: p.write_text("[" * 50_000 + "]" * 50_000)),
    "huge-integer": in_render("x.yaml", lambda p: p.write_text("a: " + "9" * 5000)),
    "not-utf8-garbage": in_render("x.yaml", lambda p: p.write_bytes(b"\xff\xfe: [\x00")),
}


@pytest.mark.timeout(SECONDS)
@pytest.mark.parametrize("case", sorted(RENDER_DAMAGE))
def test_diff_refuses_what_is_no_render(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = rendered(tmp_path)
    head = tmp_path / "head"
    head.mkdir()
    for path in base.iterdir():
        (head / path.name).write_bytes(path.read_bytes())
    RENDER_DAMAGE[case](head)
    capsys.readouterr()
    status = diff.main([str(base), str(head)])
    judged(status, capsys.readouterr().err, expected={EXIT_USAGE})


RECORD_DAMAGE: dict[str, Callable[[Path], object]] = {
    "fifo": os.mkfifo,
    "dev-zero": lambda p: p.symlink_to("/dev/zero"),
    "deep-json": lambda p: p.write_text("[" * 100_000 + "]" * 100_000),
    "huge-integer": lambda p: p.write_text('[{"uuid": "GPU-1", "memoryTotalBytes": ' + "9" * 5000 + "}]"),
    "infinite-memory": lambda p: p.write_text('[{"uuid": "GPU-1", "memoryTotalBytes": Infinity}]'),
    "not-a-list": lambda p: p.write_text('{"uuid": 1}'),
}


@pytest.mark.timeout(SECONDS)
@pytest.mark.parametrize("tool", ["discover", "audit"])
@pytest.mark.parametrize("case", sorted(RECORD_DAMAGE))
def test_a_record_that_is_no_record(tool: str, case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "record.json"
    RECORD_DAMAGE[case](record)
    if tool == "discover":
        status = discover.main(["--record", str(record)])
    else:
        stack = write_stack(tmp_path, valid_config())
        status = audit.main(["--stack-file", str(stack), "--node", "gpu-node-01", "--record", str(record)])
    judged(status, capsys.readouterr().err, expected={EXIT_USAGE})


def arguments_cases(tmp_path: Path) -> dict[str, tuple[Callable[[list[str]], int], list[str]]]:
    stack = str(write_stack(tmp_path, valid_config()))
    kc = str(kubeconfig(tmp_path))
    watch = ["--stack-file", stack, "--node", "gpu-node-01", "--record", str(RECORD), "--watch"]
    (tmp_path / "a-file").write_text("")
    (tmp_path / "empty").mkdir()
    cases: dict[str, tuple[Callable[[list[str]], int], list[str]]] = {
        **{
            f"verify --deadline {d}": (verify.main, ["--stack-file", stack, "--kubeconfig", kc, "--deadline", d])
            for d in ("0", "-1", "nan", "inf", "1e999", "x")
        },
        **{
            f"release --deadline {d}": (
                release.main,
                ["--stack-file", stack, "--node", "gone", "--kubeconfig", kc, "--deadline", d],
            )
            for d in ("0", "nan")
        },
        **{f"audit --interval {i}": (audit.main, [*watch, "--interval", i]) for i in ("0", "nan", "-5", "inf")},
        **{f"audit --metrics-port {p}": (audit.main, [*watch, "--metrics-port", p]) for p in ("99999", "-5", "0")},
        **{
            f"discover --expose {e!r}": (discover.main, ["--record", str(RECORD), "--expose", e])
            for e in ("", " ", "\u0663", "0,,1", "1,1", "9" * 5000)
        },
        "render --out with a 300-character name": (
            render.main,
            ["--stack-file", stack, "--out", str(tmp_path / ("x" * 300))],
        ),
        "fleet --stacks-dir missing": (fleet.main, ["--stacks-dir", str(tmp_path / "nope")]),
        "fleet --stacks-dir a file": (fleet.main, ["--stacks-dir", str(tmp_path / "a-file")]),
        "fleet --stacks-dir empty": (fleet.main, ["--stacks-dir", str(tmp_path / "empty")]),
        "verify with a missing exec credential plugin": (
            verify.main,
            [
                "--stack-file",
                stack,
                "--deadline",
                "5",
                "--kubeconfig",
                str(
                    kubeconfig(
                        tmp_path,
                        "{exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: no-such-plugin-here}}",
                    )
                ),
            ],
        ),
    }
    return cases


ARGUMENT_CASES = [
    *(f"verify --deadline {d}" for d in ("0", "-1", "nan", "inf", "1e999", "x")),
    *(f"release --deadline {d}" for d in ("0", "nan")),
    *(f"audit --interval {i}" for i in ("0", "nan", "-5", "inf")),
    *(f"audit --metrics-port {p}" for p in ("99999", "-5", "0")),
    *(f"discover --expose {e!r}" for e in ("", " ", "\u0663", "0,,1", "1,1", "9" * 5000)),
    "render --out with a 300-character name",
    "fleet --stacks-dir missing",
    "fleet --stacks-dir a file",
    "fleet --stacks-dir empty",
    "verify with a missing exec credential plugin",
]


@pytest.mark.timeout(SECONDS)
@pytest.mark.parametrize("case", ARGUMENT_CASES)
def test_a_bad_argument_is_one_line_and_2_before_any_request(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command, argv = arguments_cases(tmp_path)[case]
    started = time.monotonic()
    status = call(command, argv)
    err = capsys.readouterr().err
    judged(status, err, expected={EXIT_USAGE})
    # Waits for nothing (a request would wait out the 120 s deadline); 15 s covers a cold client import under load.
    assert time.monotonic() - started < 15, "a refusal waits for nothing"


# Generated YAML fragments under another namespace: anchors, aliases, numbers, escapes and nesting.
fragments = st.recursive(
    st.one_of(
        st.integers(min_value=-(10**6), max_value=10**6).map(str),
        st.integers(min_value=100, max_value=6000).map(lambda n: "9" * n),
        st.sampled_from(
            ['"\\ud800"', '"\\udfff"', '"\\u00e9"', "&a 1", "*a", "~", ".nan", "1e400", "0o7", "!!binary AA=="]
        ),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=12).map(
            lambda t: '"' + t.replace("\\", "").replace('"', "") + '"'
        ),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: "[" + ", ".join(items) + "]"),
        st.lists(inner, max_size=3).map(lambda items: "{" + ", ".join(f"k{i}: {v}" for i, v in enumerate(items)) + "}"),
        inner.map(lambda item: "&r [" + item + ", *r]"),
        st.integers(min_value=1, max_value=200).map(lambda n: "[" * n + "]" * n),
    ),
    max_leaves=8,
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fragment=fragments, tool=st.sampled_from(["discover", "audit", "fleet"]))
def test_generated_stack_files_end_in_a_status_never_a_crash(
    fragment: str, tool: str, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    tmp_path = tmp_path_factory.mktemp("generated")
    path = stack_dir(tmp_path, stack_text(f"  other:x: {fragment}"))
    command, argv = STACK_READERS[tool](path, tmp_path)
    capsys.readouterr()
    status = call(command, argv)
    judged(status, capsys.readouterr().err)


@settings(max_examples=examples(400), deadline=None)
@given(text=st.text(max_size=12))
def test_expose_takes_ascii_indices_only(text: str) -> None:
    from host.discover import parse_indices  # noqa: PLC0415
    from host.nvml import Gpu  # noqa: PLC0415

    gpus = [Gpu(i, uuid, "g", "b", 0, False) for i, uuid in enumerate([EXPOSED, *HIDDEN])]
    try:
        indices = parse_indices(text, gpus)
    except UsageError as error:
        assert "\n" not in str(error)
        return
    picked = [p.strip() for p in text.split(",")]
    assert text.strip() == "none" or all(p.isascii() and p.isdigit() for p in picked)
    assert len(set(indices)) == len(indices) and all(0 <= i < len(gpus) for i in indices)


def tool_process(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


@pytest.mark.subprocess
def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`offline.diff A B | head`: the reader is gone before the tool writes."""
    base = rendered(tmp_path)
    process = tool_process("-m", "offline.diff", str(base), str(ROOT / "stacks"))
    assert process.stdout is not None
    process.stdout.close()
    _, err = process.communicate(timeout=60)
    assert process.returncode == EXIT_CLOSED_PIPE and err == "", err
