"""The access guard's claims policy as an attacker tests it: every claim route (tests/support/routes.py) denied by its
rule; the claims tenants need admitted; with no node allocated by DRA no GPU class claimable, the allowed NIC class
still so; claims in exempt namespaces not judged; a claim left from warn mode never allocated nor reserved for one more
pod by the scheduler's status writes, while deallocation and metadata updates pass. The rendered policy runs in a real
CEL engine (tests/support/guard.py); docs/security.md lists the same routes with their sources."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from offline.program import run_program
from tests.support.guard import TENANT, admit, claims_policy, rules_denying
from tests.support.guard_config import guard
from tests.support.routes import CLAIM_BENIGN, CLAIM_ROUTES, CLAIMS_GUARD
from tests.support.stacks import changed, dra_allocated


@pytest.fixture(scope="module")
def claims() -> dict[str, Any]:
    """The claims policy of a stack whose GPUs DRA allocates, and one allowed NIC class."""
    config = dra_allocated(changed(lambda c: c.update({"hidden-gpu:guard": CLAIMS_GUARD})))
    return claims_policy(run_program(config, "test"))


@pytest.mark.parametrize("route", CLAIM_ROUTES, ids=list(CLAIM_ROUTES))
def test_every_claim_route_is_denied(claims: dict[str, Any], route: str) -> None:
    obj, rule = CLAIM_ROUTES[route]
    assert rules_denying(claims, obj) == (rule if isinstance(rule, list) else [rule])


@pytest.mark.parametrize("name", CLAIM_BENIGN, ids=list(CLAIM_BENIGN))
def test_claims_tenants_need_are_admitted(claims: dict[str, Any], name: str) -> None:
    assert admit(claims, CLAIM_BENIGN[name]) == []


def test_without_dra_no_gpu_class_is_claimable() -> None:
    """Where no node is allocated by DRA the stack has no GPU class: a claim from one that looks like it is denied, and the
    allowed NIC class stays claimable."""
    plain = claims_policy(run_program(guard(**CLAIMS_GUARD), "test"))
    assert rules_denying(plain, CLAIM_BENIGN["one-exposed-gpu"]) == ["claim-device-classes"]
    assert admit(plain, CLAIM_BENIGN["allowed-nic"]) == []


def test_claims_in_exempt_namespaces_are_not_judged(claims: dict[str, Any]) -> None:
    assert admit(claims, CLAIM_ROUTES["nvidia-gpu-class"][0], namespace="kube-system") is None


def test_a_claim_left_from_warn_is_never_allocated_nor_reserved(claims: dict[str, Any]) -> None:
    """issue 40, 1: a claim of NVIDIA's class made while the guard only warned. The scheduler's status write that
    allocates it, or reserves an allocated one for one more pod, is judged by the claim rules; one that deallocates
    it, or touches nothing of either, is not; nor is a metadata update (a finalizer going)."""
    left = copy.deepcopy(CLAIM_ROUTES["nvidia-gpu-class"][0])
    left["metadata"]["namespace"] = TENANT
    allocation = {
        "devices": {"results": [{"request": "r", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"}]}
    }
    allocated = {**left, "status": {"allocation": allocation}}
    reserved = {
        **left,
        "status": {"allocation": allocation, "reservedFor": [{"resource": "pods", "name": "p", "uid": "1"}]},
    }
    twice = {
        **left,
        "status": {
            **reserved["status"],
            "reservedFor": [*reserved["status"]["reservedFor"], {"resource": "pods", "name": "q", "uid": "2"}],
        },
    }
    assert rules_denying(claims, allocated, old=left, sub_resource="status") == ["claim-device-classes"]
    assert rules_denying(claims, twice, old=reserved, sub_resource="status") == ["claim-device-classes"]
    assert admit(claims, left, old=allocated, sub_resource="status") == []  # deallocation
    assert admit(claims, reserved, old=twice, sub_resource="status") == []  # a pod gone
    swapped = {**left, "status": {**reserved["status"], "reservedFor": [{"resource": "pods", "name": "q", "uid": "2"}]}}
    assert rules_denying(claims, swapped, old=reserved, sub_resource="status") == ["claim-device-classes"]
    finalized = {**left, "metadata": {**left["metadata"], "finalizers": []}}
    assert admit(claims, finalized, old=left) == []
