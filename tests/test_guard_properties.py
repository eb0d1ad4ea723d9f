"""Generated pods, ConfigMaps and Secrets against the rendered guard and an independent oracle
(tests/support/oracle.py, a model of the scheduler, kubelet, containerd and toolkit): whatever the guard
admits reaches no device the kubelet did not allocate to it, and pods built only from benign parts are
admitted."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offline.program import run_program
from tests.support.examples import examples
from tests.support.guard import admit, env_keys_policy, pod_policy
from tests.support.oracle import example_cluster, routes
from tests.support.pod_strategies import ALLOWED_PATH, benign_pods, data, pods
from tests.support.stacks import changed

# runc and gvisor are declared plain; the example cluster's nodes say which handlers really are NVIDIA's.
GUARD = {"allowedHostPaths": [ALLOWED_PATH], "plainRuntimeClasses": ["gvisor", "runc"]}
CONFIG = changed(lambda c: c.__setitem__("hidden-gpu:guard", GUARD))
FAST = settings(max_examples=examples(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def policies() -> tuple[dict[str, Any], dict[str, Any]]:
    run = run_program(CONFIG, "test")
    return pod_policy(run), env_keys_policy(run)


@FAST
@given(pod=pods(), configmaps=st.tuples(data, data), secrets=st.tuples(data, data))
def test_whatever_the_guard_admits_reaches_no_unrequested_device(
    policies: tuple[dict[str, Any], dict[str, Any]],
    pod: dict[str, Any],
    configmaps: tuple[dict[str, str], dict[str, str]],
    secrets: tuple[dict[str, str], dict[str, str]],
) -> None:
    pod_rules, key_rules = policies
    cluster = example_cluster(allowed_host_paths=(ALLOWED_PATH,))
    for name, values in zip(("a", "b"), configmaps, strict=True):
        if admit(key_rules, {"kind": "ConfigMap", "metadata": {"name": name}, "data": values}) == []:
            cluster.configmaps[name] = values
    for name, values in zip(("a", "b"), secrets, strict=True):
        if admit(key_rules, {"kind": "Secret", "metadata": {"name": name}, "data": values}) == []:
            cluster.secrets[name] = values
    if admit(pod_rules, pod) == []:
        assert routes(pod, cluster) == [], pod


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=benign_pods())
def test_pods_of_benign_parts_are_admitted(
    policies: tuple[dict[str, Any], dict[str, Any]], pod: dict[str, Any]
) -> None:
    assert admit(policies[0], pod) == [], pod
