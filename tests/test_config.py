"""The stack config rules: every rejection names the key path and the bad value, in one line."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest

from common.names import DEFAULT_PLUGIN_NAMESPACE
from offline.program import run_program
from stack_config import InvalidConfigError, parse_project_config
from tests.support.rejections import REJECTIONS, Rejection
from tests.support.stacks import EXPOSED, changed, node, valid_config


def assert_names(message: str, case: Rejection) -> None:
    assert "\n" not in message, message
    assert message.startswith(case.key + " ") or message.startswith(case.key + ":"), message
    if case.value is not None:
        assert case.value in message, message
    assert case.reason in message, message


@pytest.mark.parametrize("case", REJECTIONS, ids=lambda case: case.id)
def test_rejected_with_key_and_value(case: Rejection) -> None:
    with pytest.raises(InvalidConfigError) as raised:
        parse_project_config(case.config)
    assert len(raised.value.errors) == 1
    assert_names(str(raised.value.errors[0]), case)


@pytest.mark.parametrize("case", REJECTIONS[:3], ids=lambda case: case.id)
def test_program_refuses_before_declaring_anything(case: Rejection) -> None:
    # Under `pulumi up`, RunError prints the message without a traceback.
    with pytest.raises(pulumi.RunError, match="invalid stack config: hidden-gpu:"):
        run_program(case.config, "test")


def test_valid_config_is_accepted_and_typed() -> None:
    stack = parse_project_config(valid_config())
    assert [n.name for n in stack.nodes] == ["gpu-node-01", "gpu-node-02"]
    assert stack.nodes[0].exposed_gpus == [EXPOSED]
    assert stack.nodes[1].exposed_gpus == []
    assert stack.quotas == {"ml-team": 1}
    assert stack.device_plugin.namespace == DEFAULT_PLUGIN_NAMESPACE
    assert stack.device_plugin.create_namespace is True


def test_pulumi_json_strings_are_decoded() -> None:
    """`pulumi up` hands structured config to the program as JSON text."""
    config = {key: json.dumps(value) for key, value in valid_config().items()}
    assert parse_project_config(config) == parse_project_config(valid_config())


def test_other_namespaces_pass_through() -> None:
    config = changed(lambda c: c.update({"kubernetes:kubeconfig": "~/.kube/prod", "pulumi:tags": {"a": "b"}}))
    assert parse_project_config(config) == parse_project_config(valid_config())


def test_hidden_gpus_may_be_omitted() -> None:
    stack = parse_project_config(changed(lambda c: node(c).pop("hiddenGpus")))
    assert stack.nodes[0].hidden_gpus == []


@pytest.mark.parametrize(
    "image",
    [
        "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
        "registry.example.com:5000/mirror/k8s-device-plugin:v0.20.0",
        "nvcr.io/nvidia/k8s-device-plugin@sha256:" + "a" * 64,
        "nvcr.io/nvidia/k8s-device-plugin:v0.20.0@sha256:" + "b" * 64,
    ],
)
def test_pinned_images_are_accepted(image: str) -> None:
    config = changed(lambda c: c["hidden-gpu:devicePlugin"].__setitem__("image", image))
    assert parse_project_config(config).device_plugin.image == image


def test_registry_port_is_not_a_tag() -> None:
    config = changed(lambda c: c["hidden-gpu:devicePlugin"].__setitem__("image", "registry.local:5000/plugin"))
    with pytest.raises(InvalidConfigError, match="no tag or digest"):
        parse_project_config(config)


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (
            lambda c: c.pop("kubernetes:context"),
            "kubernetes:context: required: name the cluster this stack changes",
        ),
        (
            lambda c: c.pop("pulumi:disable-default-providers"),
            'pulumi:disable-default-providers: must list "kubernetes"',
        ),
        (
            lambda c: c.__setitem__("pulumi:disable-default-providers", ["aws"]),
            'pulumi:disable-default-providers = ["aws"]: must list "kubernetes"',
        ),
        (
            lambda c: c.__setitem__("kubernetes:contxt", "admin@prod"),
            "kubernetes:contxt = \"admin@prod\": unknown key; did you mean 'context'?",
        ),
        (
            lambda c: c.__setitem__("kubernetes:namespace", "default"),
            'kubernetes:namespace = "default": unknown key; the program\'s provider reads only context, kubeconfig, cluster',
        ),
    ],
    ids=["no-context", "default-providers-on", "default-providers-other", "context-typo", "ignored-key"],
)
def test_the_cluster_keys_are_required_and_checked(change: Any, line: str) -> None:
    with pytest.raises(InvalidConfigError) as raised:
        parse_project_config(changed(change))
    assert len(raised.value.errors) == 1
    assert str(raised.value.errors[0]).startswith(line)


def test_a_kubeconfig_alone_names_the_cluster() -> None:
    def kubeconfig_only(config: dict[str, Any]) -> None:
        del config["kubernetes:context"]
        config["kubernetes:kubeconfig"] = "~/.kube/prod"

    assert parse_project_config(changed(kubeconfig_only)).nodes
