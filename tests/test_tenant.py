"""The tenant's side: the example pod is strict-valid and admitted; a pool's one RuntimeClass selects
every node of the pool; the plugin's scheduling keys follow the stack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from common.names import NODE_LABEL, POOL_LABEL, pool_class_name
from common.tokens import Token
from offline.program import run_program
from stack_config import read_stack_file
from tests.support.guard import admit, pod_policy
from tests.support.objects import only, plugins
from tests.support.stacks import EXPOSED, changed, node

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tenant-pod.yaml"
SECOND = "GPU-99999999-1111-4222-8333-444455556666"


def example() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return loaded


@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_the_example_is_strict_valid(version: str) -> None:
    kubernetes_validate.validate(example(), version, strict=True)


def test_the_example_is_admitted_by_the_prod_guard_and_names_a_prod_class() -> None:
    run = run_program(read_stack_file(ROOT / "stacks" / "Pulumi.prod.yaml"), "prod")
    classes = {r.inputs["metadata"]["name"] for r in run.of_type(Token.RUNTIME_CLASS)}
    assert example()["spec"]["runtimeClassName"] in classes
    assert admit(pod_policy(run), example(), example()["metadata"]["namespace"]) == []


def pooled(config: dict[str, Any]) -> None:
    node(config)["pool"] = "shared"
    node(config, 1).update({"pool": "shared", "exposedGpus": [SECOND]})


def test_a_pool_renders_one_runtime_class_selecting_all_its_nodes() -> None:
    run = run_program(changed(pooled), "test")
    runtime_class = only(run.of_type(Token.RUNTIME_CLASS)).inputs
    assert runtime_class["metadata"]["name"] == pool_class_name("shared")
    assert runtime_class["scheduling"]["nodeSelector"] == {POOL_LABEL: "shared"}
    patches = {r.inputs["metadata"]["name"]: r.inputs["metadata"]["labels"] for r in run.of_type(Token.NODE_PATCH)}
    assert {name: (labels[POOL_LABEL], labels[NODE_LABEL]) for name, labels in patches.items()} == {
        "gpu-node-01": ("shared", "gpu-node-01"),
        "gpu-node-02": ("shared", "gpu-node-02"),
    }
    assert len(plugins(run)) == 2
    # The plugins and the pinned operands beside them (dcgm-exporter, by default) all run under the pool's class.
    daemon_sets = run.of_type(Token.DAEMONSET)
    assert {d.inputs["spec"]["template"]["spec"]["runtimeClassName"] for d in daemon_sets} == {
        pool_class_name("shared")
    }
    assert run.outputs["nodes"]["gpu-node-01"]["runtimeClass"] == pool_class_name("shared")


def test_node_names_cannot_collide_with_pool_classes() -> None:
    from stack_config import InvalidConfigError, parse_project_config  # noqa: PLC0415

    with pytest.raises(InvalidConfigError, match="would collide with pool RuntimeClasses"):
        parse_project_config(changed(lambda c: node(c).__setitem__("name", "pool-a")))


def test_plugin_scheduling_keys_follow_the_stack() -> None:
    keys = {
        "tolerations": [{"operator": "Exists"}],
        "priorityClassName": "gpu-critical",
        "imagePullSecrets": ["nvcr-pull"],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
    }
    run = run_program(changed(lambda c: c["hidden-gpu:devicePlugin"].update(keys)), "test")
    pod = only(plugins(run)).inputs["spec"]["template"]["spec"]
    # The stack's, then guard.scope's shared-node toleration, which every hidden-gpu pod carries.
    assert pod["tolerations"] == [
        {"operator": "Exists"},
        {"key": "hidden-gpu.io/shared-node", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert pod["priorityClassName"] == "gpu-critical"
    assert pod["imagePullSecrets"] == [{"name": "nvcr-pull"}]
    assert pod["containers"][0]["resources"] == keys["resources"]
    assert EXPOSED in str(pod)
