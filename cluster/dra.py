"""What cluster.verify checks of Dynamic Resource Allocation: plain functions over the listed DeviceClasses and
ResourceSlices, each finding as (scope, check, expected, actual).

- No DeviceClass maps an NVIDIA resource name (`nvidia.com/gpu`, `.shared`, `mig-...`) through
  `extendedResourceName`: the scheduler would then place plain `nvidia.com/gpu` pods through DRA, from whatever the
  class selects, on nodes whose pinned plugin advertises fewer (NVIDIA's chart sets it on its `gpu.nvidia.com` class
  with resource.k8s.io/v1: deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-gpu.yaml:7-14).
- Where DRA allocates a node, the stack's classes exist with the declared selector (their quotas: cluster.verify's
  quota check, with nvidia.com/gpu's).
- No ResourceSlice of a stack's node lists a hidden GPU at all (the pinned kubelet plugin sees only the exposed ones;
  NVIDIA's stock one, privileged, publishes every GPU), and none a class tenants may use would select, nor a GPU the
  node's pinned plugin serves (the scheduler's resource fit and the DRA allocator never consult each other: a GPU
  with two allocators goes out twice). A class's CEL
  selectors are evaluated here as the allocator would, over the device's attributes; a selector this evaluator
  cannot run (a DRA-only function such as `quantity` or `semver`) counts as selecting: fail closed, named.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

import cel

from common.names import DRA_UUID_ATTRIBUTE, NVIDIA_RESOURCE_PATTERN
from desired.node_labels import device_selector, gpu_device_classes
from stack_config import StackConfig

Finding = tuple[str, str, str, str]
# The domains a selector reads: an unknown one reads as an empty map in the allocator, so it is provided empty.
_DOMAIN = re.compile(r"device\.(?:attributes|capacity)\[\s*['\"]([^'\"]+)['\"]\s*\]")
_VALUE_KINDS = ("string", "int", "bool", "version")


def _selectors(device_class: dict[str, Any]) -> list[str]:
    return [
        str((s.get("cel") or {}).get("expression", "false"))
        for s in (device_class.get("spec") or {}).get("selectors") or []
    ]


def _device_input(driver: str, device: dict[str, Any], expressions: list[str]) -> dict[str, Any]:
    """The `device` a selector sees: attributes and capacities by domain (an unqualified name is the driver's)."""
    domains: dict[str, dict[str, dict[str, Any]]] = {"attributes": {}, "capacity": {}}
    for expression in expressions:
        for domain in _DOMAIN.findall(expression):
            domains["attributes"].setdefault(domain, {})
            domains["capacity"].setdefault(domain, {})
    for name, value in (device.get("attributes") or {}).items():
        domain, _, short = name.rpartition("/")
        typed = next((value[kind] for kind in _VALUE_KINDS if isinstance(value, dict) and kind in value), None)
        domains["attributes"].setdefault(domain or driver, {})[short] = typed
    for name, value in (device.get("capacity") or {}).items():
        domain, _, short = name.rpartition("/")
        domains["capacity"].setdefault(domain or driver, {})[short] = (value or {}).get("value")
    return {"device": {"driver": driver, **domains}}


@functools.lru_cache(maxsize=1024)
def compiled(expression: str) -> Any:
    """A CEL expression compiled once: every device of every slice is judged by the same few class selectors, every
    leftover object by the same few guard rules (cluster/leftovers.py)."""
    return cel.compile(expression)


def selects(device_class: dict[str, Any], driver: str, device: dict[str, Any]) -> bool | None:
    """Whether every selector of the class admits the device; None when one cannot be evaluated here."""
    expressions = _selectors(device_class)
    context = _device_input(driver, device, expressions)
    for expression in expressions:
        try:
            verdict = compiled(expression).execute(context)
        except Exception:
            return None
        if verdict is not True:
            return False
    return True


def uuid_of(driver: str, device: dict[str, Any]) -> str | None:
    attributes = device.get("attributes") or {}
    value = attributes.get(DRA_UUID_ATTRIBUTE) or attributes.get(f"{driver}/{DRA_UUID_ATTRIBUTE}") or {}
    found = value.get("string") if isinstance(value, dict) else None
    return found if isinstance(found, str) else None


def check_dra(
    stack: StackConfig, classes: dict[str, dict[str, Any]], slices: list[dict[str, Any]]
) -> Iterator[Finding]:
    mapped = sorted(
        f"{name}->{resource}"
        for name, found in classes.items()
        if re.search(
            NVIDIA_RESOURCE_PATTERN, resource := str((found.get("spec") or {}).get("extendedResourceName", ""))
        )
    )
    yield "cluster", "DeviceClasses mapping an NVIDIA resource", "none", ",".join(mapped) or "none"
    ours = gpu_device_classes(stack)
    dra = stack.dra_settings
    if dra is not None:
        for name, uuids in sorted(ours.items()):
            found = classes.get(name)
            declared = [device_selector(dra.driver, uuids)]
            actual = "<missing>" if found is None else ("as declared" if _selectors(found) == declared else "differs")
            yield "cluster", f"DeviceClass {name}", "as declared", actual
    tenant_classes = {
        name: classes[name] for name in sorted({*stack.guard.allowed_device_classes, *ours}) if name in classes
    }
    for node in stack.nodes:
        mine = [s for s in slices if (s.get("spec") or {}).get("nodeName") == node.name]
        # Kubernetes must not know a hidden GPU exists: the pinned kubelet plugin publishes none (a stock one does).
        yield node.name, "hidden GPUs in its ResourceSlices", "none", _listed(mine, set(node.hidden_gpus))
        reached = _selected(mine, set(node.hidden_gpus), tenant_classes)
        yield node.name, "hidden GPUs a tenant DeviceClass selects", "none", reached
        if node.runs_plugin:
            reached = _selected(mine, set(node.exposed_gpus), tenant_classes)
            yield node.name, "GPUs of its device plugin a tenant DeviceClass selects", "none", reached


def _listed(slices: list[dict[str, Any]], uuids: set[str]) -> str:
    """Which of these GPUs these slices list, by slice."""
    listed = []
    for found in slices:
        driver = str((found.get("spec") or {}).get("driver", ""))
        for device in (found.get("spec") or {}).get("devices") or []:
            if (uuid := uuid_of(driver, device)) in uuids:
                listed.append(f"{uuid} in ResourceSlice {found['metadata'].get('name')}")
    return "; ".join(sorted(listed)) or "none"


def _selected(slices: list[dict[str, Any]], uuids: set[str], tenant_classes: dict[str, dict[str, Any]]) -> str:
    """Which of these GPUs, published in these slices, a tenant class would select, and by which class."""
    reached = []
    for found in slices:
        driver = str((found.get("spec") or {}).get("driver", ""))
        for device in (found.get("spec") or {}).get("devices") or []:
            uuid = uuid_of(driver, device)
            if uuid not in uuids:
                continue
            for name, device_class in tenant_classes.items():
                verdict = selects(device_class, driver, device)
                if verdict is not False:
                    reached.append(f"{uuid} by {name}" + ("" if verdict else " (selector not evaluable here)"))
    return "; ".join(sorted(reached)) or "none"
