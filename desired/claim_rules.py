"""The claims policy's rules, as CEL: which DeviceClasses a tenant's ResourceClaims and templates may ask for, and
how. Plain data (no Pulumi)."""

from __future__ import annotations

from common.names import DRA_GROUP, DRA_VERSION
from desired.guard_settings import REQUEST, GuardSettings, Rule, cel

# Claims and templates are judged when created: their spec is immutable (kubernetes v1.36.3
# pkg/apis/resource/validation/validation.go:116-122, 621-626). And a claim again when the scheduler's status write
# allocates it or reserves it for one more pod (the subresource `resourceclaims/status`): a claim made while the guard
# only warned is then never allocated, nor handed to a new pod (issue 40, 1); deallocation passes. Requests through
# v1beta1/v1beta2 match too (matchPolicy Equivalent, the default), converted to v1.
CLAIMS_RULE = {
    "apiGroups": [DRA_GROUP],
    "apiVersions": [DRA_VERSION],
    "operations": ["CREATE", "UPDATE"],
    "resources": ["resourceclaims", "resourceclaimtemplates", "resourceclaims/status"],
}


def _given(field: str) -> str:
    """CEL: the field is there and not null. The API server hands a policy a claim's `null` as written (`requests:
    null` has it, then fails "got 'types.Null', expected iterable type"): null reads as absent, as the API does."""
    return f"(has({field}) && {field} != null)"


def _reservations(obj: str) -> str:
    return f"({_given(obj + '.status')} && {_given(obj + '.status.reservedFor')} ? {obj}.status.reservedFor : [])"


def _allocated(obj: str) -> str:
    return f"({_given(obj + '.status')} && {_given(obj + '.status.allocation')})"


def claim_variables() -> list[tuple[str, str]]:
    """Whether the request is judged (a create; a status write that allocates the claim or reserves it for one more
    pod), and then its device requests, or a template's (under spec.spec); none otherwise, so every rule passes.
    `dyn`: the two kinds have different types."""
    return [
        (
            "judged",
            "request.operation == 'CREATE' || (request.subResource == 'status' && oldObject != null && ("
            f"(!{_allocated('oldObject')} && {_allocated('object')})"
            # A consumer the old list lacks, by uid: a swap that keeps the count is a new reservation too.
            f" || {_reservations('object')}.exists(r, !{_reservations('oldObject')}.exists(o, o.uid == r.uid))))",
        ),
        (
            "claimSpec",
            "request.kind.kind == 'ResourceClaimTemplate' ? dyn(object).spec.spec : dyn(object).spec",
        ),
        (
            "requests",
            f"variables.judged && {_given('variables.claimSpec.devices')}"
            f" && {_given('variables.claimSpec.devices.requests')} ? variables.claimSpec.devices.requests : []",
        ),
    ]


def _every_alternative(check: str) -> str:
    """CEL: `check` (over `d`) holds for each request's `exactly` and for each of its `firstAvailable`
    alternatives, which name their own classes (the allocator takes the first it can satisfy)."""
    return (
        f"variables.requests.all(r, (!{_given('r.exactly')} || [r.exactly].all(d, {check}))"
        f" && (!{_given('r.firstAvailable')} || r.firstAvailable.all(d, {check})))"
    )


def claim_rules(args: GuardSettings) -> list[Rule]:
    tenant_classes = sorted({*args.allowed_device_classes, *args.gpu_device_classes})
    ours = cel(sorted(args.gpu_device_classes))
    return [
        Rule(
            "claim-device-classes",
            _every_alternative(f"d.deviceClassName in {cel(tenant_classes)}"),
            "a claim may name only the DeviceClasses this stack lets tenants use ("
            + (", ".join(tenant_classes) or "none")
            + "): any other class selects whatever devices it matches, hidden GPUs included; for a GPU, "
            f"{REQUEST}" + (", or claim from the stack's own classes" if args.gpu_device_classes else ""),
        ),
        Rule(
            "claim-admin-access",
            f"variables.requests.all(r, !{_given('r.exactly')} || !{_given('r.exactly.adminAccess')}"
            " || !r.exactly.adminAccess)",
            "adminAccess reaches devices already allocated to other pods, whatever their class: not here",
        ),
        Rule(
            "claim-tolerations",
            _every_alternative(f"!{_given('d.tolerations')} || size(d.tolerations) == 0"),
            "a claim may not tolerate device taints: the platform taints the devices no tenant may have",
        ),
        Rule(
            "claim-exact-count",
            _every_alternative(
                f"!(d.deviceClassName in {ours}) || !{_given('d.allocationMode')} || d.allocationMode == 'ExactCount'"
            ),
            "claims from the stack's GPU classes ask for an exact count (allocationMode ExactCount, the default), "
            "which the namespace's quota caps",
        ),
    ]
