"""The Python distribution of the components (pyproject.toml), the component provider's own install: built from
its files alone, installed elsewhere, and the components used from it under Pulumi's public test mocks; never a
library for other programs (generic top-level names), and never published."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.tokens import Token
from offline import package_schema
from tests.support.checkout import copy_tracked

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PACKAGES: list[str] = PROJECT["tool"]["setuptools"]["packages"]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if found:
            pins[found[1].lower()] = found[2]
    return pins


def test_the_distribution_is_never_published_as_a_library() -> None:
    """Its top-level names are generic (a program's own `components/` would collide): PyPI refuses the upload."""
    assert "Private :: Do Not Upload" in PROJECT["project"]["classifiers"]
    assert {"common", "components"} <= set(PACKAGES)  # the reason; a namespaced layout would lift both lines


def test_each_dependency_starts_at_the_projects_own_pin() -> None:
    """The distribution's ranges begin where requirements.txt pins, so what the tests ran is inside them."""
    pinned = _pins(ROOT / "requirements.txt")
    for requirement in PROJECT["project"]["dependencies"]:
        name, lower = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([^,]+),<\d+", requirement).groups()  # type: ignore[union-attr]
        assert pinned[name.lower()] == lower, requirement


CONSUMER = textwrap.dedent(
    """
    import json, sys
    import pulumi
    import components
    from components import HiddenGpuNode

    created = []

    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args):
            created.append(args.typ)
            return [args.name + "-id", args.inputs]

        def call(self, args):
            return {}

    pulumi.runtime.set_mocks(Mocks(), preview=False)
    node = {"name": "gpu-node-01", "exposedGpus": ["GPU-ad1885a3-7130-40c4-b974-497269842a22"]}
    HiddenGpuNode("gpu-node-01", {"node": node, "device_plugin": {}, "plugin_namespace": "hidden-gpu-system"})

    @pulumi.runtime.test
    def settled():
        return pulumi.Output.from_input(None)

    settled()
    print(json.dumps({"file": components.__file__, "created": sorted(set(created))}))
    """
)


@pytest.mark.slow
def test_the_distribution_installs_and_a_program_uses_it(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", str(source), "-w", str(wheels)], check=True, timeout=300)
    (wheel,) = wheels.glob("hidden_gpu-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300)

    # Outside the checkout, the installed copy first: -P keeps the working directory off sys.path.
    run = subprocess.run(
        [sys.executable, "-P", "-c", CONSUMER],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    said = json.loads(run.stdout.splitlines()[-1])
    assert said["file"].startswith(str(site))
    assert Token.HIDDEN_GPU_NODE in said["created"]
    assert {Token.NODE_PATCH, Token.DAEMONSET, Token.RUNTIME_CLASS} <= set(said["created"])


@pytest.mark.slow
def test_the_plugin_installs_its_own_requirements_and_serves(tmp_path: Path) -> None:
    """package/ as Pulumi's Python runtime runs a source plugin from a clone (issue 42, 3): a virtualenv of its own
    (PulumiPlugin.yaml), requirements.txt installed into it from package/, then `python __main__.py` there. The
    components come from that virtualenv alone: the clone's root is not on sys.path and the checkout's .venv is
    not used; the provider starts and says its port."""
    clone = tmp_path / "clone"
    copy_tracked(clone)
    plugin = clone / "package"
    manifest = yaml.safe_load((plugin / "PulumiPlugin.yaml").read_text())
    venv = plugin / manifest["runtime"]["options"]["virtualenv"]
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "install", "-r", "requirements.txt"], cwd=plugin, check=True, timeout=600)
    provider = subprocess.Popen(
        [str(python), "__main__.py", "127.0.0.1:1"],
        cwd=plugin,
        env={"PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert provider.stdout is not None
        port = provider.stdout.readline().strip()
        assert port.isdigit(), provider.stderr.read() if provider.stderr else port
    finally:
        provider.kill()
        provider.communicate(timeout=10)  # reaps it and closes both pipes
    where = subprocess.run(
        [str(python), "-P", "-c", "import components; print(components.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(venv)), where.stdout


def test_the_committed_schema_is_the_one_served() -> None:
    """package/schema.json is what package/'s provider serves today: a change to what consumers bind against shows
    in review, and a stale copy fails here (python -m offline.package_schema writes it)."""
    assert package_schema.main(["--check"]) == 0


def _check_against(schema: dict[str, Any], spec: dict[str, Any], value: Any, where: str) -> list[str]:
    """Where a YAML value does not fit its schema type: unknown keys of objects, recursively through $refs."""
    if isinstance(value, str) and value.startswith("${"):
        return []
    ref = spec.get("$ref", "")
    if ref.startswith("#/types/"):
        spec = schema["types"][ref.removeprefix("#/types/")]
    if spec.get("type") == "object" and "properties" in spec and isinstance(value, dict):
        problems = [f"{where}.{k}: not in the schema" for k in value if k not in spec["properties"]]
        for key, item in value.items():
            if key in spec["properties"]:
                problems += _check_against(schema, spec["properties"][key], item, f"{where}.{key}")
        return problems
    if spec.get("type") == "array" and isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _check_against(schema, spec["items"], v, f"{where}[{i}]")]
    return []


def test_the_yaml_consumer_example_binds_against_the_schema() -> None:
    """examples/package-consumer/Pulumi.yaml names only types, inputs and outputs package/schema.json has: the check
    YAML's binder makes first (the program itself runs in tests/real/test_package.py; no TypeScript or Go consumer
    runs here, as their language hosts are not served)."""
    schema = json.loads((ROOT / "package" / "schema.json").read_text())
    program = yaml.safe_load((ROOT / "examples" / "package-consumer" / "Pulumi.yaml").read_text())
    problems, types = [], {}
    for name, resource in program["resources"].items():
        declared = schema["resources"].get(resource["type"])
        if declared is None:
            problems.append(f"{name}: no type {resource['type']}")
            continue
        types[name] = declared
        spec = {"type": "object", "properties": declared["inputProperties"]}
        problems += _check_against(schema, spec, resource.get("properties", {}), name)
    for output in program["outputs"].values():
        resource, prop = re.fullmatch(r"\$\{(\w+)\.(\w+)\}", output).groups()  # type: ignore[union-attr]
        if prop not in types[resource]["properties"]:
            problems.append(f"outputs: {resource} has no output {prop}")
    assert problems == []
