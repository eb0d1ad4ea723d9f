"""The house's rules: host tools never load Pulumi or the Kubernetes client, and the non-public
Pulumi SDK symbols the program relies on still have the shape it relies on."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import tomllib
from contextvars import ContextVar
from pathlib import Path

import pytest

from offline import sdk

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_ON_HOST = ("pulumi", "pulumi_kubernetes", "kubernetes")
HOST_MODULES = sorted(f"host.{p.stem}" for p in (ROOT / "host").glob("*.py") if p.stem != "__init__")


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function (the lazy imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


# Importing every host module and every module they import anywhere, with the forbidden packages
# made unimportable: a transitive import of any of them fails here, however deep.
BLOCKER = """
import importlib, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {forbidden!r}:
            raise ImportError(f"{{name}} imported on the GPU host")
sys.meta_path.insert(0, Block())
for module in {modules!r}:
    importlib.import_module(module)
print(sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r}))
"""


@pytest.mark.subprocess
def test_host_tools_import_neither_pulumi_nor_kubernetes() -> None:
    lazily = {
        m
        for p in (ROOT / "host").glob("*.py")
        for m in imports_of(p)
        if m.split(".")[0] in ("stack_config", "common", "host")
    }
    modules = sorted(set(HOST_MODULES) | lazily)
    assert "stack_config" in {m.split(".")[0] for m in modules}  # the stack-reading modes are covered
    code = BLOCKER.format(forbidden=FORBIDDEN_ON_HOST, modules=modules)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_blocker_would_catch_a_forbidden_import(tmp_path: Path) -> None:
    """The boundary test is only worth something if a transitive import fails under it."""
    (tmp_path / "leaky.py").write_text("import pulumi\n")
    code = BLOCKER.format(forbidden=FORBIDDEN_ON_HOST, modules=["leaky"])
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "pulumi imported on the GPU host" in result.stderr


def test_common_is_standard_library_only() -> None:
    for path in (ROOT / "common").glob("*.py"):
        for module in imports_of(path):
            top = module.split(".")[0]
            assert top in sys.stdlib_module_names or top in ("common", "__future__"), f"{path.name} imports {module}"


def test_the_distributed_code_uses_the_public_pulumi_sdk_only() -> None:
    """What pyproject.toml distributes (the components, the stack models, the names) imports no private part
    of the SDK: pulumi.runtime is the language host's, and offline/sdk.py alone reaches into it."""
    for room in tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]:
        for path in (ROOT / room).glob("*.py"):
            private = sorted(m for m in imports_of(path) if m.startswith("pulumi.runtime") or "._" in m)
            assert private == [], f"{room}/{path.name} imports {private}"


@pytest.mark.parametrize(("module", "attribute"), sdk.PRIVATE_SYMBOLS, ids=[f"{m}.{a}" for m, a in sdk.PRIVATE_SYMBOLS])
def test_private_pulumi_symbols_still_exist(module: str, attribute: str) -> None:
    found = getattr(importlib.import_module(module), attribute, None)
    assert found is not None, (
        f"the Pulumi SDK no longer has {module}.{attribute}; offline/sdk.py depends on it: "
        "adapt the adapter to the new SDK before upgrading pulumi"
    )


def test_private_pulumi_symbols_keep_their_shape() -> None:
    settings = importlib.import_module("pulumi.runtime.settings")
    assert isinstance(settings.ROOT, ContextVar), "settings.ROOT: a ContextVar"
    assert list(inspect.signature(importlib.import_module("pulumi.runtime.stack").run_pulumi_func).parameters) == [
        "func"
    ], "run_pulumi_func(func)"
    assert callable(getattr(sdk.MockMonitor, "RegisterResource", None)), "MockMonitor.RegisterResource"
    assert "monitor" in inspect.signature(importlib.import_module("pulumi.runtime").set_mocks).parameters


def test_only_the_offline_tools_use_the_harness() -> None:
    """The program and every room but offline/ run as they would under the CLI: none imports the mock harness's
    private-SDK adapter or its runner (offline.sdk, offline.program)."""
    harness = ("offline.sdk", "offline.program")
    users = [ROOT / "__main__.py", *(p for m, p in _module_files().items() if not m.startswith("offline"))]
    for path in users:
        found = sorted(n for n in _our_imports(path) if n.startswith(harness))
        assert found == [], f"{path.relative_to(ROOT)} imports {found}"


def test_the_tree_says_where_code_runs() -> None:
    rooms = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    assert {
        "components",
        "desired",
        "stacks",
        "tests",
        "offline",
        "cluster",
        "host",
        "common",
        "stack_config",
        "policy",
    } <= rooms
    assert not (ROOT / "tools").exists()
    for room in ("offline", "cluster", "host", "common", "desired"):
        doc = importlib.import_module(room).__doc__
        assert doc, f"{room}/__init__.py must say where its code runs"


@pytest.mark.subprocess
def test_pod_resources_stubs_are_generated_from_our_proto(tmp_path: Path) -> None:
    """The stubs are protoc's output for host/podresources/api.proto, never edited by hand (make protos)."""
    proto = "host/podresources/api.proto"
    command = [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", f"--python_out={tmp_path}"]
    command += [f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}", proto]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
        generated = (tmp_path / "host" / "podresources" / name).read_text()
        assert generated == (ROOT / "host" / "podresources" / name).read_text(), f"{name} is stale: run make protos"


def test_our_proto_states_the_kubelets_wire_format() -> None:
    """Service, package and field numbers as kubernetes' podresources/v1/api.proto has them."""
    from host.podresources import api_pb2  # noqa: PLC0415

    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert sorted(m.name for m in service.methods) == ["Get", "GetAllocatableResources", "List"]
    numbers = {
        "PodResources": {"name": 1, "namespace": 2, "containers": 3},
        "ContainerResources": {"name": 1, "devices": 2, "dynamic_resources": 5},
        "DynamicResource": {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4},
        "ClaimResource": {"cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4, "share_id": 5},
        "CDIDevice": {"name": 1},
        "ContainerDevices": {"resource_name": 1, "device_ids": 2, "topology": 3},
        "AllocatableResourcesResponse": {"devices": 1},
        "ListPodResourcesResponse": {"pod_resources": 1},
        "GetPodResourcesRequest": {"pod_name": 1, "pod_namespace": 2},
    }
    for message, fields in numbers.items():
        descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
        assert {f.name: f.number for f in descriptor.fields} == fields


PRODUCT_ROOMS = ("common", "stack_config", "desired", "components", "offline", "cluster", "host", "policy", "package")


def _our_imports(path: Path) -> set[str]:
    """The modules of this repository a file imports, at any depth of its code (lazy imports too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return {name for name in found if name.split(".")[0] in (*PRODUCT_ROOMS, "tests", "e2e", "lab")}


def _module_files() -> dict[str, Path]:
    files = {}
    for room in PRODUCT_ROOMS:
        for path in (ROOT / room).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def test_product_code_never_imports_the_tests() -> None:
    """The tests' fakes stay in tests/: a tool that needs one to run is a proof, and lives in e2e/."""
    for module, path in _module_files().items():
        leaked = sorted(name for name in _our_imports(path) if name.split(".")[0] in ("tests", "e2e", "lab"))
        assert leaked == [], f"{module} imports {leaked}"


def test_the_testbed_never_imports_the_lab() -> None:
    """e2e/ is the testbed the real tiers start (processes, PKI, control plane, node, images, Go builds); lab/ holds
    the GPU-host runs and the benchmarks built on it, never the other way round."""
    for path in (ROOT / "e2e").rglob("*.py"):
        leaked = sorted(name for name in _our_imports(path) if name.split(".")[0] in ("lab", "tests"))
        assert leaked == [], f"{path.relative_to(ROOT)} imports {leaked}"


def test_no_import_loops() -> None:
    """Between modules of the product, counting imports inside functions and TYPE_CHECKING blocks too."""
    files = _module_files()
    graph = {
        module: {name if name in files else name.rsplit(".", 1)[0] for name in _our_imports(path)}
        & set(files) - {module}
        for module, path in files.items()
    }
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            cycle = [*trail[trail.index(module) :], module]
            raise AssertionError("import loop: " + " -> ".join(cycle))
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, [*trail, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_every_name_common_names_owns_is_used() -> None:
    """A name nothing reads is a name that drifts: it may say something the code no longer does."""
    names = importlib.import_module("common.names")
    defined = [
        n
        for n, v in vars(names).items()
        if not n.startswith("_") and getattr(v, "__module__", "common.names") == "common.names"
    ]
    sources = {
        p: p.read_text() for room in (*PRODUCT_ROOMS, "tests", "e2e", "lab") for p in (ROOT / room).rglob("*.py")
    }
    own = (ROOT / "common" / "names.py").read_text()
    unused = [
        n
        for n in defined
        if not any(re.search(rf"\b{n}\b", text) for p, text in sources.items() if p.name != "names.py")
        and len(re.findall(rf"\b{n}\b", own)) < 2
    ]
    assert unused == []


@pytest.mark.subprocess
def test_the_cluster_tools_do_not_load_pulumi() -> None:
    """verify and release compare the cluster with plain data (guard_rules, node_labels, stack_claims)."""
    check = "import sys, cluster.verify, cluster.release; print(sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi', 'pulumi_kubernetes')))"
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.subprocess
def test_the_desired_state_loads_no_pulumi() -> None:
    """desired/ computes the objects without Pulumi: the cluster tools and the policy pack read it without loading
    the SDK, and a component is what adds resource options around it."""
    modules = sorted(f"desired.{p.stem}" for p in (ROOT / "desired").glob("*.py") if p.stem != "__init__")
    code = BLOCKER.format(forbidden=("pulumi", "pulumi_kubernetes"), modules=modules)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_components_hold_only_resources_and_the_tools_read_desired() -> None:
    """Every module of components/ imports Pulumi (a plain one belongs in desired/), and neither the cluster tools
    nor desired/ import components/: no lazy importer is needed to keep Pulumi out of `cluster.verify`."""
    plain = [p.name for p in (ROOT / "components").glob("*.py") if p.stem != "__init__" and "pulumi" not in
             {m.split(".")[0] for m in imports_of(p)}]  # fmt: skip
    assert plain == [], f"plain modules in components/ (move them to desired/): {plain}"
    for room in ("cluster", "desired", "host", "stack_config", "common"):
        for path in (ROOT / room).rglob("*.py"):
            reached = sorted(m for m in imports_of(path) if m.split(".")[0] == "components")
            assert reached == [], f"{path.relative_to(ROOT)} imports {reached}"
