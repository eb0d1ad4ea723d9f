"""The stack-file loader shared by the program and every tool, fed generated documents: it answers
with a stack or with one line per problem naming where, and never with anything else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.cli import EXIT_OK, EXIT_USAGE
from offline import render
from stack_config import InvalidConfigError, load_stack_file
from tests.support.examples import examples
from tests.support.stacks import EXPOSED, HIDDEN

KEYS = ["nodes", "quotas", "devicePlugin", "guard", "clusterPolicy", "nodez", "exposedGpus"]
LOOKALIKES = [
    EXPOSED.replace("-", "\u2010", 1),  # a hyphen that is not one
    EXPOSED.replace("a", "\u0430"),  # Cyrillic a
    EXPOSED.upper(),
    " " + EXPOSED,
    EXPOSED + "\u200b",  # zero-width space
]
YAML_11 = ["yes", "no", "on", "off", "y", "n", "~", "null", "2024-01-01", "0x1f", "0o17", "1_000", ".inf", "1e3"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    st.sampled_from([EXPOSED, *HIDDEN, *LOOKALIKES, "all", "0", "3", "gpu-node-01", "enforce", "volume-mounts"]),
    st.integers(min_value=2000, max_value=5000).map(lambda n: "GPU-" + "x" * n),  # huge values
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from([*KEYS, "name", "exposedGpus", "hiddenGpus", "mode", "patch", "secure"]), inner, max_size=4
        ),
        st.builds(lambda v: {"secure": v}, st.text(max_size=10)),
    ),
    max_leaves=20,
)
node = st.fixed_dictionaries(
    {
        "name": st.one_of(st.just("gpu-node-01"), scalars),
        "exposedGpus": st.one_of(st.lists(scalars, max_size=3), values),
    },
    optional={"hiddenGpus": st.lists(scalars, max_size=3), "migStrategy": scalars, "timeSlicing": values},
)
configs = st.dictionaries(
    st.one_of(st.sampled_from([f"hidden-gpu:{k}" for k in KEYS]), st.sampled_from(["kubernetes:context", "other:x"])),
    st.one_of(values, st.lists(node, max_size=3)),
    max_size=5,
)


def document(config: dict[str, Any], raw: str | None, depth: int) -> str:
    """The config as YAML, then maybe a raw YAML 1.1 spelling or deep nesting spliced in."""
    text = yaml.safe_dump({"config": config}, allow_unicode=True)
    if raw is not None:
        text += f"  hidden-gpu:guard: {{mode: {raw}}}\n"
    if depth:
        text += "  other:deep: " + "[" * depth + "]" * depth + "\n"
    return text


def check_answer(path: Path) -> None:
    try:
        load_stack_file(path)
    except InvalidConfigError as error:
        lines = str(error).splitlines()
        assert lines, "an error with no problem in it"
        for line in lines:
            assert line.startswith(("hidden-gpu:", "kubernetes:", "pulumi:", str(path))), line
            assert len(line) < 1000, line


@settings(
    max_examples=examples(400),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)
@given(config=configs, raw=st.one_of(st.none(), st.sampled_from(YAML_11)), depth=st.sampled_from([0, 0, 5, 40]))
def test_the_loader_answers_a_stack_or_located_problems(
    config: dict[str, Any], raw: str | None, depth: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "Pulumi.fuzz.yaml"
    path.write_text(document(config, raw, depth), encoding="utf-8")
    check_answer(path)


@settings(max_examples=examples(200), deadline=None)
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_are_refused_in_one_line(data: bytes, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("bytes") / "Pulumi.bytes.yaml"
    path.write_bytes(b"config:\n  hidden-gpu:nodes: " + data)
    check_answer(path)


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)
@given(config=configs, raw=st.one_of(st.none(), st.sampled_from(YAML_11)))
def test_render_exits_0_or_2_and_writes_nothing_on_2(
    config: dict[str, Any], raw: str | None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    work = tmp_path_factory.mktemp("render")
    path = work / "Pulumi.fuzz.yaml"
    path.write_text(document(config, raw, 0), encoding="utf-8")
    status = render.main(["--stack-file", str(path), "--out", str(work / "out")])
    assert status in (EXIT_OK, EXIT_USAGE)
    if status == EXIT_USAGE:
        assert sorted(p.name for p in work.iterdir()) == ["Pulumi.fuzz.yaml"]
