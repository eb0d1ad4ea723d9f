"""Every object every stack renders is valid Kubernetes, under strict schemas."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from common.cli import stack_files
from offline import render

STACK_FILES = stack_files()
KUBERNETES_VERSIONS = ["1.30", "1.37"]


def rendered_objects() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{path.name}:{name}", obj) for path in STACK_FILES for name, obj in render.render(path).files.items()]


OBJECTS = rendered_objects()


def test_every_stack_is_covered() -> None:
    assert {p.name for p in STACK_FILES} >= {"Pulumi.dev.yaml", "Pulumi.prod.yaml"}
    assert {name.split(":")[0] for name, _ in OBJECTS} == {p.name for p in STACK_FILES}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("name", "obj"), OBJECTS, ids=[name for name, _ in OBJECTS])
def test_object_is_valid_kubernetes(name: str, obj: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_strict_validation_catches_an_unknown_field(version: str) -> None:
    """Guards the guard: a typo in a pod spec must fail the schema check."""
    daemonset = copy.deepcopy(next(obj for _, obj in OBJECTS if obj["kind"] == "DaemonSet"))
    daemonset["spec"]["template"]["spec"]["nodeSelecter"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, version, strict=True)
