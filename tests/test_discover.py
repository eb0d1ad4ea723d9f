"""host.discover against an injected fake NVML."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from host import discover
from stack_config import parse_project_config
from tests.support.fake_nvml import FakeGpu, fake_nvml
from tests.support.stacks import CLUSTER, write_stack

ROOT = Path(__file__).resolve().parent.parent
UUIDS = [f"GPU-{i:08x}-1111-4222-8333-44445555666{i}" for i in range(4)]
MIG = "MIG-0badcafe-1111-4222-8333-444455556666"


def host() -> list[FakeGpu]:
    gpus = [FakeGpu(uuid, bus_id=f"00000000:{0x1B + i:02X}:00.0") for i, uuid in enumerate(UUIDS)]
    gpus[3].mig_uuids = [MIG, None]
    return gpus


def run(args: list[str], capsys: pytest.CaptureFixture[str], gpus: list[FakeGpu] | None = None) -> tuple[int, str, str]:
    status = discover.main(args, nvml=fake_nvml(host() if gpus is None else gpus))
    out, err = capsys.readouterr()
    return status, out, err


def test_json_fields(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["--json"], capsys)
    gpus = json.loads(out)
    assert status == 0
    assert gpus[0] == {
        "index": 0,
        "uuid": UUIDS[0],
        "name": "NVIDIA H200",
        "pciBusId": "00000000:1B:00.0",
        "memoryTotalBytes": 150_754_820_096,
        "migEnabled": False,
        "migDevices": [],
    }
    assert gpus[3]["migEnabled"] is True and gpus[3]["migDevices"] == [{"uuid": MIG}]


def test_table_lists_every_gpu_and_mig_device(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run([], capsys)
    assert status == 0
    assert out.splitlines()[0].split() == ["INDEX", "UUID", "NAME", "PCI", "BUS", "ID", "MEMORY", "MIG"]
    for uuid in [*UUIDS, MIG]:
        assert uuid in out
    assert "140.4 GiB" in out and "on, 1 devices" in out


def test_expose_writes_a_valid_stack_entry_by_uuid(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["--expose", "0,2", "--node", "gpu-node-07"], capsys)
    assert status == 0
    entry = yaml.safe_load(out)[0]
    assert entry == {"name": "gpu-node-07", "exposedGpus": [UUIDS[0], UUIDS[2]], "hiddenGpus": [UUIDS[1], UUIDS[3]]}
    stack = parse_project_config({**CLUSTER, "hidden-gpu:nodes": [entry]})
    assert stack.nodes[0].exposed_gpus == [UUIDS[0], UUIDS[2]]


def test_expose_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(["--expose", "none", "--node", "n"], capsys)
    assert yaml.safe_load(out)[0]["exposedGpus"] == []


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        ("9", "'9' is not a GPU index on this host (0-3)"),
        ("1,1", "index 1 given twice"),
        ("a", "'a' is not"),
        ("", "no index given; to expose no GPU, say --expose none"),
        ("0,,1", "an empty item is not a GPU index"),
        ("\u0663", "'\u0663' is not a GPU index"),  # ARABIC-INDIC DIGIT THREE: str.isdigit() takes it as 3
        ("\u00b2", "'\u00b2' is not a GPU index"),
    ],
)
def test_expose_rejects_bad_indices(indices: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["--expose", indices], capsys)
    assert status == 2 and out == "" and message in err and err.count("\n") == 1


def node_stack(tmp_path: Path, exposed: list[str], hidden: list[str]) -> Path:
    node = {"name": "gpu-node-07", "exposedGpus": exposed, "hiddenGpus": hidden}
    return write_stack(tmp_path, {**CLUSTER, "hidden-gpu:nodes": [node]})


def test_check_passes_when_every_gpu_is_accounted_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stack = node_stack(tmp_path, [UUIDS[0]], UUIDS[1:])
    status, out, _ = run(["--check", "--stack-file", str(stack), "--node", "gpu-node-07"], capsys)
    assert status == 0 and out.strip().endswith("result: every GPU accounted for")


def test_check_reports_unlisted_and_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stranger = "GPU-99999999-1111-4222-8333-444455556666"
    stack = node_stack(tmp_path, [UUIDS[0]], [UUIDS[1], stranger])
    status, out, _ = run(["--check", "--stack-file", str(stack), "--node", "gpu-node-07"], capsys)
    assert status == 1
    assert f"UNLISTED  {UUIDS[2]}  index 2" in out and f"UNLISTED  {UUIDS[3]}  index 3" in out
    assert f"MISSING   {stranger}: hidden in the stack, not on this host" in out
    assert "result: 3 problem(s)" in out


def test_check_unknown_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["--check", "--stack-file", str(node_stack(tmp_path, [], UUIDS)), "--node", "other"], capsys)
    assert status == 2 and "--node other: not in" in err and "(nodes: gpu-node-07)" in err


def test_check_invalid_stack_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(
        ["--check", "--stack-file", str(node_stack(tmp_path, ["0"], [])), "--node", "gpu-node-07"], capsys
    )
    assert status == 2 and "Pulumi.case.yaml:8: hidden-gpu:nodes[0].exposedGpus[0] = " in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("error", "message"),
    [
        ("LibraryNotFound", "no NVIDIA driver here"),
        ("DriverNotLoaded", "not loaded"),
        ("NoPermission", "no permission"),
        ("Unknown", "NVML failed to start"),
    ],
)
def test_nvml_failures_are_one_line_with_status_3(error: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    status = discover.main(["--json"], nvml=fake_nvml([], init_error=error))
    out, err = capsys.readouterr()
    assert status == 3 and out == "" and message in err and err.count("\n") == 1


@pytest.mark.subprocess
def test_real_module_without_a_driver() -> None:
    """CI has nvidia-ml-py but no driver: the real pynvml must fail cleanly, no traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "host.discover", "--json"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 3
    assert (
        result.stderr == "error: no NVIDIA driver here: libnvidia-ml.so could not be loaded; run this on the GPU host\n"
    )


@pytest.mark.subprocess
def test_listing_gpus_imports_neither_pulumi_nor_pydantic() -> None:
    code = "import sys, host.discover; print(sorted(m for m in ('pulumi', 'pydantic', 'yaml', 'kubernetes') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_recorded_host_can_be_tried_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/host-record.json is dev's node as discover --json would print it: the docs' way to try the tools."""
    record = str(ROOT / "examples" / "host-record.json")
    assert discover.main(["--record", record, "--check", "--stack", "dev", "--node", "dgx-dev-01"]) == 0
    assert capsys.readouterr().out.strip().endswith("result: every GPU accounted for")
    assert discover.main(["--record", record, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((ROOT / "examples" / "host-record.json").read_text())


def test_a_file_that_is_not_a_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "r.json").write_text('{"uuid": "x"}')
    assert discover.main(["--record", str(tmp_path / "r.json")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --record {tmp_path / 'r.json'}: not a host record")
