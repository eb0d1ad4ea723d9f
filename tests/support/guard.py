"""Evaluating the rendered admission policies as the API server does, in a real CEL engine."""

from __future__ import annotations

import copy
import functools
from typing import Any

import cel

from common.names import ENV_KEYS_POLICY_NAME, POLICY_NAME, Token
from offline.program import ProgramRun
from tests.support.objects import only

CUDA_IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"
TENANT = "ml-team"


def policies(run: ProgramRun) -> dict[str, dict[str, Any]]:
    """The rendered policies by name: the pod policy and the env-keys policy."""
    return {r.inputs["metadata"]["name"]: r.inputs for r in run.of_type(Token.ADMISSION_POLICY)}


def pod_policy(run: ProgramRun) -> dict[str, Any]:
    return policies(run)[POLICY_NAME]


def env_keys_policy(run: ProgramRun) -> dict[str, Any]:
    return policies(run)[ENV_KEYS_POLICY_NAME]


def admit(
    policy: dict[str, Any],
    obj: dict[str, Any],
    namespace: str = TENANT,
    *,
    old: dict[str, Any] | None = None,
    sub_resource: str = "",
    namespace_labels: dict[str, str] | None = None,
) -> list[str] | None:
    """None when the policy does not apply; otherwise the messages of the failed validations,
    evaluated as the API server does: match conditions, then variables in order, then validations."""
    request = {
        "namespace": namespace,
        "operation": "CREATE" if old is None else "UPDATE",
        "subResource": sub_resource,
        "kind": {"kind": obj.get("kind", "Pod")},
    }
    labels = {"kubernetes.io/metadata.name": namespace, **(namespace_labels or {})}
    context: dict[str, Any] = {
        "object": obj,
        "oldObject": old,
        "request": request,
        "namespaceObject": {"metadata": {"name": namespace, "labels": labels}},
    }
    spec = policy["spec"]
    if not all(evaluate(c["expression"], context) for c in spec.get("matchConditions", [])):
        return None
    context["variables"] = {}
    for variable in spec.get("variables", []):
        context["variables"][variable["name"]] = evaluate(variable["expression"], context)
    return [v["message"] for v in spec["validations"] if not evaluate(v["expression"], context)]


@functools.lru_cache(maxsize=256)
def _compiled(expression: str) -> Any:
    return cel.compile(expression)


def evaluate(expression: str, context: dict[str, Any]) -> Any:
    """One expression, compiled once: the property tests evaluate each thousands of times."""
    return _compiled(expression).execute(context)


def pod(*containers: dict[str, Any], annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": TENANT}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": list(containers) or [container()], **spec},
    }


def container(
    name: str = "app", gpus: str | None = None, resource: str = "nvidia.com/gpu", **extra: Any
) -> dict[str, Any]:
    built: dict[str, Any] = {"name": name, "image": CUDA_IMAGE, **extra}
    if gpus is not None:
        built["resources"] = {"limits": {resource: gpus}, "requests": {resource: gpus}}
    return built


def env(name: str, value: str) -> dict[str, Any]:
    return {"env": [{"name": name, "value": value}]}


def with_ephemeral(base: dict[str, Any], debugger: dict[str, Any]) -> dict[str, Any]:
    updated = copy.deepcopy(base)
    updated["spec"].setdefault("ephemeralContainers", []).append(debugger)
    return updated


def plugin_pod(run: ProgramRun) -> dict[str, Any]:
    template = only(run.of_type(Token.DAEMONSET)).inputs["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template["metadata"],
        "spec": copy.deepcopy(template["spec"]),
    }
