"""The real Pulumi CLI and engine on this project beyond one stack's life, against the tier's session control plane:
project config in Pulumi.yaml that sets the guard to audit is merged in by the CLI and refused by the program; a
`nodes` value that is not a list is refused by the CLI itself under the project's generated config declarations,
before the program runs; and a component renamed with an alias to its old name keeps its object (no create, no
delete, the same uid), as offline.diff says it will.
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s
import pytest
import yaml
from pulumi import automation as auto

from common.names import GPU_QUOTA_KEY, QUOTA_NAME
from common.tokens import Token
from components.gpu_quotas import GpuQuotas, GpuQuotasArgs
from e2e.controlplane import ControlPlane
from offline import config_reference
from tests.real.harness import pulumi_stack
from tests.real.test_lifecycle import nodes
from tests.support.stacks import EXPOSED


def test_config_the_cli_adds_is_refused(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Pulumi.yaml's project config sets the guard to audit for every stack; the stack file, what reviewers
    read, says nothing. The real CLI merges it in; the program refuses to run with it."""
    work = tmp_path_factory.mktemp("project-config")
    (work / "Pulumi.yaml").write_text(
        yaml.safe_dump(
            {"name": "hidden-gpu", "runtime": "python", "config": {"hidden-gpu:guard": {"value": {"mode": "audit"}}}}
        )
    )
    config = {
        "pulumi:disable-default-providers": ["kubernetes"],
        "kubernetes:kubeconfig": str(plane.kubeconfig("admin")),
        "kubernetes:context": "admin@e2e",
        "hidden-gpu:nodes": nodes([EXPOSED]),
    }
    (work / "Pulumi.drift.yaml").write_text(yaml.safe_dump({"config": config}))
    stack = pulumi_stack(work, "drift", own_project_file=True)
    with pytest.raises(auto.CommandError) as failed:
        stack.preview()
    assert "hidden-gpu:guard: differs from" in str(failed.value), str(failed.value)[-3000:]
    assert "Pulumi.yaml's project config" in str(failed.value)


def test_the_cli_type_checks_stack_config_against_the_declarations(
    plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Pulumi.yaml's generated declarations are ones the real CLI reads: a nodes value that is not a list
    is refused by the CLI itself, before the program runs."""
    work = tmp_path_factory.mktemp("declared")
    project_file = {"name": "hidden-gpu", "runtime": "python", "config": config_reference.pulumi_config()}
    (work / "Pulumi.yaml").write_text(yaml.safe_dump(project_file, sort_keys=False))
    config = {
        "pulumi:disable-default-providers": ["kubernetes"],
        "kubernetes:kubeconfig": str(plane.kubeconfig("admin")),
        "kubernetes:context": "admin@e2e",
        "hidden-gpu:nodes": {"name": "gpu-node-01"},
    }
    (work / "Pulumi.typed.yaml").write_text(yaml.safe_dump({"config": config}))
    stack = pulumi_stack(work, "typed", own_project_file=True)
    with pytest.raises(auto.CommandError) as failed:
        stack.preview()
    assert "configuration key 'nodes' must be of type 'array<object>'" in str(failed.value), str(failed.value)[-2000:]
    assert "invalid stack config" not in str(failed.value)  # the CLI refused it, not the program


def test_a_rename_with_an_alias_keeps_the_object(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> None:
    """GpuQuotas named its quotas off the namespace; it now names them off itself, with an alias to the old
    name. The real engine, given a stack made by the old naming, keeps the object: no create, no delete,
    the same uid (what offline.diff says as 'renamed ... with an alias: Pulumi keeps the object')."""
    namespace = "ml-alias"
    plane.request(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    kubeconfig = str(plane.kubeconfig("admin"))

    def with_provider() -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(provider=k8s.Provider("kubernetes", kubeconfig=kubeconfig, context="admin@e2e"))

    class OldGpuQuotas(pulumi.ComponentResource):
        def __init__(self, name: str, opts: pulumi.ResourceOptions) -> None:
            super().__init__(Token.GPU_QUOTAS, name, None, opts)
            k8s.core.v1.ResourceQuota(
                f"{namespace}-gpu-quota",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=QUOTA_NAME, namespace=namespace),
                spec=k8s.core.v1.ResourceQuotaSpecArgs(hard={GPU_QUOTA_KEY: "1"}),
                opts=pulumi.ResourceOptions(parent=self),
            )

    work = tmp_path_factory.mktemp("alias")
    (work / "Pulumi.alias.yaml").write_text(yaml.safe_dump({"config": {}}))

    def before() -> None:
        OldGpuQuotas("gpu-quotas", with_provider())

    def after() -> None:
        GpuQuotas("gpu-quotas", GpuQuotasArgs(quotas={namespace: 1}), with_provider())

    stack = pulumi_stack(work, "alias", inline=before)
    stack.up()
    quota = f"/api/v1/namespaces/{namespace}/resourcequotas/{QUOTA_NAME}"
    uid = plane.request("GET", quota)["metadata"]["uid"]

    renamed = stack.up(program=after)
    changes = renamed.summary.resource_changes or {}
    assert "create" not in changes and "delete" not in changes and "replace" not in changes, changes
    assert plane.request("GET", quota)["metadata"]["uid"] == uid
    stack.destroy()
