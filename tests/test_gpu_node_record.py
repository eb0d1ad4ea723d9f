"""The GPU host run's record (docs/measurements/h200-real-node.json) holds what docs/testing.md's tables say of it,
read through the run's own summary: CI cannot make that run (no GPU), but it can keep the record, the summary and
the docs in step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import gpu_host, gpu_node_run

RECORD = Path(__file__).resolve().parent.parent / "docs" / "measurements" / "h200-real-node.json"
# The same run on an H100 after the run's split into modules (issue 39): both records must say the same.
RECORDS = pytest.mark.parametrize("record", [RECORD, RECORD.with_name("h100-real-node.json")], ids=lambda p: p.stem)


@RECORDS
def test_the_record_shows_the_routes_as_the_docs_table_does(record: Path) -> None:
    result = json.loads(record.read_text())
    assert "error" not in result and not result["rehearsal"]
    uuid = result["host"]["gpus"][0]["uuid"]
    table = gpu_node_run.summary(result)
    defaults, hardened = table["defaults"], table["hardened"]
    for setting in (defaults, hardened):
        assert setting["plugin RegisteredDevices"] == {gpu_host.GPU: [uuid]}
        assert setting["allocated"]["allocated"] == setting["allocated"]["seen"] == [uuid]
        assert setting["second"]["reason"] == "UnexpectedAdmissionError"
        assert setting["void"]["seen"] == []
    for route in ("zero", "env-uuid", "unserved"):  # open under the defaults, closed hardened
        assert (defaults[route]["seen"], hardened[route]["seen"]) == ([uuid], []), route
    assert table["dra"]["while hidden"]["allocated"] == [] and table["dra"]["while exposed"]["allocated"] == [uuid]


@RECORDS
def test_the_record_shows_the_audit_naming_the_pods_as_the_docs_table_does(record: Path) -> None:
    audit = gpu_node_run.summary(json.loads(record.read_text()))["audit"]
    assert all(holder["hold"] == ["holding"] for holder in audit["holders"].values())
    assert audit["exposed"] == {
        "rc": 1,
        "violations": [
            "cuda-zero: a pod uses a GPU the kubelet did not allocate to it; the kubelet allocated it to pod "
            "ml-team/cuda-holder container smi"
        ],
    }
    assert audit["hidden"]["rc"] == 1
    assert sorted(line.split(": ", 1)[1] for line in audit["hidden"]["violations"]) == [
        "a pod uses a hidden GPU",
        "a pod uses a hidden GPU",
        "the kubelet can allocate a hidden GPU",
    ]


@RECORDS
def test_the_record_shows_the_plugin_back_in_place_after_a_kubelet_restart_as_the_docs_say(record: Path) -> None:
    result = json.loads(record.read_text())
    uuid = result["host"]["gpus"][0]["uuid"]
    restart = gpu_node_run.summary(result)["kubelet restart"]
    assert restart["plugin pod"] == {"same": True, "restartCount": [0]}
    # The refused first pod goes with a deleted pod's GPU still in the checkpoint (docs/operations.md).
    assert restart["pod at_once"]["reason"] == "UnexpectedAdmissionError" and restart["stale checkpoint entries"]
    assert restart["pod then"]["allocated"] == restart["pod then"]["seen"] == [uuid]


DRA_RECORD = RECORD.with_name("gpu-host-dra-plugin.json")


def test_the_dra_record_shows_what_docs_security_says_of_the_pinned_plugin() -> None:
    """NVIDIA's DRA kubelet plugin as rendered: exposed, the slice and the claim pod hold exactly the GPU; hidden, no
    device and the UUID in no API object; privileged (the control), the GPU published."""
    result = json.loads(DRA_RECORD.read_text())
    assert "error" not in result
    uuid = result["host"]["gpus"][0]["uuid"]
    exposed = result["exposed"]
    assert list(exposed["published"].values()) == exposed["allocated"] == exposed["claim_pod"]["seen"] == [uuid]
    assert any("Adding device gpu-0" in line for line in exposed["plugin_log"])
    assert result["hidden"]["uuid_in"] == [] and "slice_emptied_s" in result["hidden"]
    assert list(result["privileged"]["published"].values()) == [uuid]
    docs = (RECORD.parents[1] / "security.md").read_text()
    assert "docs/measurements/gpu-host-dra-plugin.json" in docs
