"""guard.addVoid: the MutatingAdmissionPolicy that gives new containers without a GPU request
NVIDIA_VISIBLE_DEVICES=void instead of a denial. Evaluated in the CEL engine, merged as server-side
apply merges, then judged by the rendered guard: what it lets through reaches no unrequested device."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings

from common.names import VISIBLE_DEVICES_ENV, VOID_POLICY_NAME, runtime_class_name
from common.tokens import Token
from desired.guard_rules import CONTAINER_KINDS
from offline import render
from offline.program import ProgramRun, run_program
from tests.support.examples import examples
from tests.support.guard import (
    admit,
    container,
    env,
    mutate,
    pod,
    pod_policy,
    void_policy,
    with_ephemeral,
)
from tests.support.objects import only
from tests.support.oracle import NVIDIA_RESOURCE, example_cluster, quantity, routes
from tests.support.pod_strategies import pods
from tests.support.stacks import changed, valid_config, write_stack

OURS = runtime_class_name("gpu-node-01")
VOID = {"name": VISIBLE_DEVICES_ENV, "value": "void"}
CONFIG = changed(lambda c: c.__setitem__("hidden-gpu:guard", {"addVoid": True, "plainRuntimeClasses": ["runc"]}))


@pytest.fixture(scope="module")
def run() -> ProgramRun:
    return run_program(CONFIG, "test")


@pytest.fixture(scope="module")
def policy(run: ProgramRun) -> dict[str, Any]:
    return void_policy(run)


def env_of(obj: dict[str, Any], kind: str = "containers") -> dict[str, list[dict[str, Any]]]:
    return {c["name"]: c.get("env", []) for c in obj["spec"].get(kind, [])}


def test_off_by_default() -> None:
    run = run_program(valid_config(), "test")
    assert run.of_type(Token.MUTATING_POLICY) == [] and run.of_type(Token.MUTATING_BINDING) == []


def test_the_policy_and_binding_are_valid_where_the_api_is_ga_and_nowhere_older(run: ProgramRun) -> None:
    objects = [only(run.of_type(Token.MUTATING_POLICY)).inputs, only(run.of_type(Token.MUTATING_BINDING)).inputs]
    for obj in objects:
        kubernetes_validate.validate(obj, "1.37", strict=True)
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):  # no such kind in that API version
            kubernetes_validate.validate(obj, "1.35", strict=True)
    policy_obj, binding = objects
    assert policy_obj["metadata"]["name"] == binding["spec"]["policyName"] == VOID_POLICY_NAME
    assert policy_obj["spec"]["reinvocationPolicy"] == "IfNeeded"


def test_a_sidecar_in_a_gpu_pod_gets_void_and_is_then_admitted(run: ProgramRun, policy: dict[str, Any]) -> None:
    tenant = pod(container("trainer", gpus="1"), container("log-shipper"), runtimeClassName=OURS)
    assert admit(pod_policy(run), tenant)  # denied as it stands
    mutated = mutate(policy, tenant)
    assert mutated is not None
    assert env_of(mutated) == {"trainer": [], "log-shipper": [VOID]}
    assert mutated["spec"]["containers"][0] == tenant["spec"]["containers"][0]  # the GPU container is untouched
    assert admit(pod_policy(run), mutated) == []


def test_init_containers_get_void_and_their_own_env_stays(policy: dict[str, Any]) -> None:
    tenant = pod(
        container("trainer", gpus="1"),
        runtimeClassName=OURS,
        initContainers=[container("fetch", **env("MODEL", "llama"))],
    )
    mutated = mutate(policy, tenant)
    assert mutated is not None
    assert env_of(mutated, "initContainers") == {"fetch": [{"name": "MODEL", "value": "llama"}, VOID]}


@pytest.mark.parametrize("value", ["all", "void", "none", "GPU-8a21c3d4-1e2f-4a3b-8c4d-5e6f7a8b9c0d"])
def test_a_container_that_names_the_variable_is_left_to_the_guard(
    run: ProgramRun, policy: dict[str, Any], value: str
) -> None:
    tenant = pod(
        container("trainer", gpus="1"), container("side", **env(VISIBLE_DEVICES_ENV, value)), runtimeClassName=OURS
    )
    assert mutate(policy, tenant) == tenant
    assert (admit(pod_policy(run), tenant) == []) == (value in ("void", "none"))


@pytest.mark.parametrize("quantity", ["1", "2", "+1"])
def test_a_container_that_requests_a_gpu_is_never_touched(policy: dict[str, Any], quantity: str) -> None:
    tenant = pod(container("trainer", gpus=quantity, resource="nvidia.com/gpu.shared"), runtimeClassName=OURS)
    assert mutate(policy, tenant) == tenant


def test_a_zero_request_is_no_request(run: ProgramRun, policy: dict[str, Any]) -> None:
    tenant = pod(container("trainer", gpus="0"), runtimeClassName=OURS)
    mutated = mutate(policy, tenant)
    assert mutated is not None and env_of(mutated) == {"trainer": [VOID]}
    assert admit(pod_policy(run), mutated) == []


@pytest.mark.parametrize(
    ("namespace", "spec"),
    [("ml-team", {}), ("ml-team", {"runtimeClassName": "runc"}), ("kube-system", {"runtimeClassName": OURS})],
    ids=["no-runtime-class", "other-runtime", "exempt-namespace"],
)
def test_pods_outside_its_scope_are_not_matched(policy: dict[str, Any], namespace: str, spec: dict[str, Any]) -> None:
    assert mutate(policy, pod(container("app"), **spec), namespace) is None


def test_kubectl_debug_gets_void_for_the_new_container_only(run: ProgramRun, policy: dict[str, Any]) -> None:
    running = pod(container("trainer", gpus="1"), runtimeClassName=OURS)
    running = with_ephemeral(running, {"name": "old-debugger", "image": "busybox"})  # admitted before the policy
    debugged = with_ephemeral(running, {"name": "debugger", "image": "busybox"})
    mutated = mutate(policy, debugged, old=running, sub_resource="ephemeralcontainers")
    assert mutated is not None
    assert env_of(mutated, "ephemeralContainers") == {"old-debugger": [], "debugger": [VOID]}
    assert mutated["spec"]["containers"] == running["spec"]["containers"]
    assert admit(pod_policy(run), mutated, old=running, sub_resource="ephemeralcontainers") == []


def test_an_update_that_adds_no_container_changes_nothing(policy: dict[str, Any]) -> None:
    old = pod(container("trainer", gpus="1"), container("side"), runtimeClassName=OURS)
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"team": "ml"}
    assert mutate(policy, relabelled, old=old) == relabelled


def test_a_second_pass_changes_nothing(policy: dict[str, Any]) -> None:
    tenant = pod(container("trainer", gpus="1"), container("side"), runtimeClassName=OURS)
    once = mutate(policy, tenant)
    assert once is not None and mutate(policy, once) == once


def requests_a_gpu(c: dict[str, Any]) -> bool:
    limits = (c.get("resources") or {}).get("limits") or {}
    return any(NVIDIA_RESOURCE.fullmatch(k) and quantity(v) > 0 for k, v in limits.items())


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated=pods())
def test_it_only_ever_adds_void_and_what_then_passes_reaches_no_unrequested_device(
    run: ProgramRun, policy: dict[str, Any], generated: dict[str, Any]
) -> None:
    mutated = mutate(policy, generated) or generated
    for kind in CONTAINER_KINDS:
        before = {c["name"]: c for c in generated["spec"].get(kind, [])}
        after = {c["name"]: c for c in mutated["spec"].get(kind, [])}
        assert before.keys() == after.keys()
        for name, c in before.items():
            if after[name] != c:
                assert not requests_a_gpu(c), name
                assert after[name] == {**c, "env": [*c.get("env", []), VOID]}, name
    if admit(pod_policy(run), mutated) == []:
        cluster = example_cluster()
        cluster.configmaps, cluster.secrets = {"a": {}, "b": {}}, {"a": {}, "b": {}}
        assert routes(mutated, cluster) == [], mutated


def test_render_writes_both_objects_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    assert render.main(["--stack-file", str(write_stack(tmp_path, CONFIG)), "--out", str(out)]) == 0
    summary = capsys.readouterr().out.splitlines()
    assert summary[0] == f"stack case: 20 objects written to {out}"
    assert summary[5].endswith("; adds NVIDIA_VISIBLE_DEVICES=void to new containers without a GPU request")
    names = {p.name for p in out.glob("mutating*.yaml")}
    assert names == {
        f"mutatingadmissionpolicy.{VOID_POLICY_NAME}.yaml",
        f"mutatingadmissionpolicybinding.{VOID_POLICY_NAME}.yaml",
    }
