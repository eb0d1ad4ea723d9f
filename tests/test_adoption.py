"""Taking over a hand-made plugin DaemonSet (issue 32, 1), in the fast tier: what the program declares for an adopted
node, and what a stack may not ask. tests/node/test_takeover.py runs the takeover on a real kubelet."""

from __future__ import annotations

from typing import Any

import pytest

from common.names import DEFAULT_PLUGIN_NAMESPACE, plugin_labels
from offline.program import run_program
from stack_config import InvalidConfigError, parse_project_config
from tests.support.objects import only, plugins
from tests.support.stacks import changed, node

ADOPT: dict[str, Any] = {
    "namespace": "kube-system",
    "name": "nvidia-device-plugin-pinned",
    "matchLabels": {"name": "nvidia-device-plugin-pinned"},
    "container": "nvidia-device-plugin-ctr",
}


def adopting(**overrides: Any) -> dict[str, Any]:
    return changed(lambda c: node(c).__setitem__("adoptDevicePlugin", {**ADOPT, **overrides}))


def test_the_adopted_daemonset_keeps_its_name_selector_and_container() -> None:
    plain, adopted = (only(plugins(run_program(c, "test"))) for c in (changed(lambda c: None), adopting()))
    assert adopted.name == plain.name  # the same resource, so no URN changes and no replacement
    metadata, spec = adopted.inputs["metadata"], adopted.inputs["spec"]
    assert (metadata["namespace"], metadata["name"]) == ("kube-system", "nvidia-device-plugin-pinned")
    assert metadata["annotations"]["pulumi.com/patchForce"] == "true"
    assert metadata["annotations"]["pulumi.com/patchFieldManager"] == "hidden-gpu"
    assert spec["selector"]["matchLabels"] == ADOPT["matchLabels"]
    labels = spec["template"]["metadata"]["labels"]
    assert labels == {**ADOPT["matchLabels"], **plugin_labels("gpu-node-01")}
    (container,) = spec["template"]["spec"]["containers"]
    assert container["name"] == ADOPT["container"]
    # Everything else as for any plugin: its env, and one plugin pod at a time.
    assert [container] != plain.inputs["spec"]["template"]["spec"]["containers"]
    assert container["env"] == plain.inputs["spec"]["template"]["spec"]["containers"][0]["env"]
    assert spec["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert plain.inputs["metadata"]["namespace"] == DEFAULT_PLUGIN_NAMESPACE


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (
            changed(lambda c: node(c, 1).__setitem__("adoptDevicePlugin", ADOPT)),
            "the node exposes no GPU, so it runs no plugin to adopt",
        ),
        (adopting(namespace="ml-team"), "not exempt from the guard"),
        (adopting(matchLabels={"app.kubernetes.io/instance": "gpu-node-02"}), "the selector would no longer match"),
        (adopting(matchLabels={}), "matchLabels"),
    ],
    ids=["no-exposed-gpu", "namespace-not-exempt", "selector-contradicts-ours", "empty-selector"],
)
def test_what_an_adoption_may_not_ask(config: dict[str, Any], reason: str) -> None:
    with pytest.raises(InvalidConfigError) as raised:
        parse_project_config(config)
    assert reason in str(raised.value), str(raised.value)
