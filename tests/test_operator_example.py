"""examples/pulumi-kubernetes-operator/prod.yaml, the in-cluster drift repair (issue 32, 2): the Stack names only fields
the operator has, repairs (refresh, resync on an unchanged commit, never destroys), names a stack this repository
holds, and its workspace's role covers every object that stack (or one with every optional component) declares."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from offline.program import run_program
from stack_config import read_stack_file

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "pulumi-kubernetes-operator" / "prod.yaml"
# pulumi-kubernetes-operator v2.9.0 operator/api/pulumi/shared/stack_types.go: the StackSpec's JSON field names.
STACK_SPEC_FIELDS = {
    "envs", "envRefs", "envSecrets", "backend", "stack", "config", "secretsProvider", "fluxSource", "programRef",
    "targets", "prerequisites", "continueResyncOnCommitMatch", "refresh", "expectNoRefreshChanges",
    "destroyOnFinalize", "runProgram", "retryOnUpdateConflict", "useLocalStackOnly", "resyncFrequencySeconds",
    "serviceAccountName", "workspaceTemplate", "environment", "projectRepo", "gitAuthSecret", "gitAuth", "repoDir",
    "commit", "branch", "shallow",
}  # fmt: skip
# Its ResourceRef types (the same file, ResourceSelectorType), and the resync floor it applies.
REF_TYPES = {"Env", "FS", "Secret", "Literal"}
MIN_RESYNC_SECONDS = 60


def documents() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(EXAMPLE.read_text())}


def test_the_stack_repairs_and_names_only_operator_fields() -> None:
    stack = documents()["Stack"]
    assert stack["apiVersion"] == "pulumi.com/v1"
    spec = stack["spec"]
    assert set(spec) <= STACK_SPEC_FIELDS, set(spec) - STACK_SPEC_FIELDS
    assert spec["refresh"] and spec["continueResyncOnCommitMatch"] and spec["useLocalStackOnly"]
    assert spec["resyncFrequencySeconds"] >= MIN_RESYNC_SECONDS and spec["destroyOnFinalize"] is False
    assert (ROOT / "stacks" / f"Pulumi.{spec['stack']}.yaml").is_file()
    assert spec["serviceAccountName"] == documents()["ServiceAccount"]["metadata"]["name"]
    for ref in spec["envRefs"].values():
        assert ref["type"] in REF_TYPES and ref["type"].lower() in ref


@pytest.mark.parametrize("kind", ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"])
def test_the_rbac_objects_are_valid_kubernetes(kind: str) -> None:
    kubernetes_validate.validate(documents()[kind], "1.37", strict=True)


def _resource(token: str) -> tuple[str, str]:
    """The API group and plural resource a pulumi-kubernetes type token writes (a Patch type writes its kind)."""
    group_version, kind = token.removeprefix("kubernetes:").split(":")
    group = group_version.rsplit("/", 1)[0]
    kind = kind.removesuffix("Patch").lower()
    plural = re.sub("y$", "ies", kind) if kind.endswith("y") else kind + ("es" if kind.endswith("s") else "s")
    return ("" if group == "core" else group), plural


@pytest.mark.parametrize("stack_file", [ROOT / "stacks" / "Pulumi.prod.yaml", ROOT / "tests/golden/Pulumi.every.yaml"])
def test_the_role_covers_every_object_the_stack_declares(stack_file: Path) -> None:
    rules = documents()["ClusterRole"]["rules"]
    declared = run_program(read_stack_file(stack_file), "prod")
    for resource in declared.kubernetes_objects:
        group, plural = _resource(resource.type)
        needed = {"get", "patch"} if resource.type.endswith("Patch") else {"get", "create", "patch", "delete"}
        granted = {
            verb
            for rule in rules
            if group in rule["apiGroups"] and plural in rule["resources"]
            for verb in rule["verbs"]
        }
        assert needed <= granted, (resource.type, group, plural, granted)
