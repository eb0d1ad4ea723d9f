"""Evaluating the rendered admission policies as the API server does, in a real CEL engine."""

from __future__ import annotations

import copy
import functools
import json
import re
from typing import Any

import cel

from common.names import CLAIMS_POLICY_NAME, ENV_KEYS_POLICY_NAME, POLICY_NAME
from common.tokens import Token
from offline.program import ProgramRun
from tests.support.objects import only, plugins

CUDA_IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"
TENANT = "ml-team"


def policies(run: ProgramRun) -> dict[str, dict[str, Any]]:
    """The rendered policies by name: the pod policy and the env-keys policy."""
    return {r.inputs["metadata"]["name"]: r.inputs for r in run.of_type(Token.ADMISSION_POLICY)}


def pod_policy(run: ProgramRun) -> dict[str, Any]:
    return policies(run)[POLICY_NAME]


def env_keys_policy(run: ProgramRun) -> dict[str, Any]:
    return policies(run)[ENV_KEYS_POLICY_NAME]


def claims_policy(run: ProgramRun) -> dict[str, Any]:
    return policies(run)[CLAIMS_POLICY_NAME]


# The request's resource (a GroupVersionResource in CEL; the resource name is enough here), for each kind judged.
RESOURCES = {
    "Pod": "pods",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "ResourceClaim": "resourceclaims",
    "ResourceClaimTemplate": "resourceclaimtemplates",
}


def _prepared(
    policy: dict[str, Any],
    obj: dict[str, Any],
    namespace: str,
    *,
    old: dict[str, Any] | None,
    sub_resource: str,
    namespace_labels: dict[str, str] | None = None,
) -> dict[str, Any] | None:
    """The CEL context after the policy's match constraints' namespace selector, its match conditions and its
    variables, as the API server builds it; None when the selector or a match condition excludes the request.
    Match conditions see `namespaceObject` null, as on kube-apiserver v1.36.3 (k8s.io/apiserver
    pkg/admission/plugin/webhook/matchconditions/matcher.go:82-85); variables and validations see the namespace."""
    request = {
        "namespace": namespace,
        "operation": "CREATE" if old is None else "UPDATE",
        "subResource": sub_resource,
        "kind": {"kind": obj.get("kind", "Pod")},
        "resource": {"resource": RESOURCES[obj.get("kind", "Pod")]},
    }
    labels = {"kubernetes.io/metadata.name": namespace, **(namespace_labels or {})}
    spec = policy["spec"]
    if not selects((spec.get("matchConstraints") or {}).get("namespaceSelector") or {}, labels):
        return None
    context: dict[str, Any] = {"object": obj, "oldObject": old, "request": request, "namespaceObject": None}
    if not all(evaluate(c["expression"], context) for c in spec.get("matchConditions", [])):
        return None
    context["namespaceObject"] = {"metadata": {"name": namespace, "labels": labels}}
    context["variables"] = {}
    for variable in spec.get("variables", []):
        context["variables"][variable["name"]] = evaluate(variable["expression"], context)
    return context


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's verdict on a label set, as apimachinery's labels.Selector gives it (an empty
    selector selects everything; NotIn and DoesNotExist select a set without the key)."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for requirement in selector.get("matchExpressions") or []:
        key, operator, values = requirement["key"], requirement["operator"], requirement.get("values") or []
        verdict = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not verdict:
            return False
    return True


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
    context = _prepared(policy, obj, namespace, old=old, sub_resource=sub_resource, namespace_labels=namespace_labels)
    if context is None:
        return None
    return [v["message"] for v in policy["spec"]["validations"] if not evaluate(v["expression"], context)]


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
    template = only(plugins(run)).inputs["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template["metadata"],
        "spec": copy.deepcopy(template["spec"]),
    }


# Keyed lists the void policy may touch: the API server refuses an apply configuration that sets
# an atomic list (apiserver mutating/patch/smd.go, validatePatch), so nothing else may appear.
KEYED_LISTS = {"initContainers", "containers", "ephemeralContainers", "env"}
TYPE_KEY = "@type"


def void_policy(run: ProgramRun) -> dict[str, Any]:
    return only(run.of_type(Token.MUTATING_POLICY)).inputs


def as_maps(expression: str) -> str:
    """An apply-configuration expression with each `Object.a.b{f: v}` initializer read as the map
    `{"@type": ".a.b", "f": v}`: the tests' engine parses initializers but cannot build them. The
    type name is kept so `mutate` can check it against the field path, as the API server does."""
    typed = re.sub(
        r"Object((?:\.\w+)*)\{", lambda m: "{" + json.dumps(TYPE_KEY) + ": " + json.dumps(m[1]) + ", ", expression
    )
    return re.sub(r"([{,]\s*)([A-Za-z_]\w*)\s*:", r'\1"\2":', typed)


def _checked(value: Any, path: str) -> Any:
    """The apply configuration without its type names, each checked against where it stands."""
    if isinstance(value, list):
        return [_checked(item, path) for item in value]
    if not isinstance(value, dict):
        return value
    assert value.get(TYPE_KEY) == path, f"initializer {value.get(TYPE_KEY)!r} stands at {path!r}"
    return {key: _checked(item, f"{path}.{key}") for key, item in value.items() if key != TYPE_KEY}


def _merged(live: Any, patch: Any, key: str = "") -> Any:
    """Server-side apply's merge of a patch into the live object, for the shapes above: maps field
    by field; keyed lists item by name, keeping the live items the patch does not name."""
    if isinstance(patch, dict):
        merged = dict(live) if isinstance(live, dict) else {}
        for field_name, value in patch.items():
            if value == [] and not merged.get(field_name):
                continue  # an empty list adds nothing, and the Pod's JSON omits an empty one
            merged[field_name] = _merged(merged.get(field_name), value, field_name)
        return merged
    if isinstance(patch, list):
        assert key in KEYED_LISTS, f"the apply configuration sets the atomic list {key!r}"
        items = [dict(item) for item in live or []]
        for item in patch:
            same = [i for i, existing in enumerate(items) if existing["name"] == item["name"]]
            if same:
                items[same[0]] = _merged(items[same[0]], item)
            else:
                items.append(item)
        return items
    return patch


def mutate(
    policy: dict[str, Any],
    obj: dict[str, Any],
    namespace: str = TENANT,
    *,
    old: dict[str, Any] | None = None,
    sub_resource: str = "",
) -> dict[str, Any] | None:
    """None when the mutating policy does not apply; otherwise the object after its mutations,
    evaluated in the CEL engine (match conditions, variables, the apply configuration) and merged."""
    context = _prepared(policy, obj, namespace, old=old, sub_resource=sub_resource)
    if context is None:
        return None
    result = copy.deepcopy(obj)
    for mutation in policy["spec"]["mutations"]:
        assert mutation["patchType"] == "ApplyConfiguration"
        expression = mutation["applyConfiguration"]["expression"]
        cel.compile(expression)  # the initializers as written parse
        result = _merged(result, _checked(evaluate(as_maps(expression), context), ""))
    return result


def rules_denying(policy: dict[str, Any], obj: dict[str, Any], **kwargs: Any) -> list[str]:
    """The names of the rules that deny the object; the policy must apply to it."""
    messages = admit(policy, obj, **kwargs)
    assert messages is not None, "the policy did not apply"
    return [message.split(":", 1)[0].removeprefix("hidden-gpu guard, rule ") for message in messages]
