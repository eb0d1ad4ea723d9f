"""Arguments for the CrossGuard policies as pulumi_policy builds them for the pack, in `up` as in preview, from
what the program declared; and a report callback that collects what a policy says."""

from __future__ import annotations

from typing import Any

from pulumi_policy import ResourceValidationArgs
from pulumi_policy.deserialize import deserialize_properties
from pulumi_policy.policy import PolicyCustomTimeouts, PolicyResource, PolicyResourceOptions
from pulumi_policy.proxy import unknown_checking_proxy

from offline.program import Declared

OPTS = PolicyResourceOptions(
    protect=False,
    ignore_changes=[],
    delete_before_replace=None,
    aliases=[],
    custom_timeouts=PolicyCustomTimeouts(0, 0, 0),
    additional_secret_outputs=[],
)


def as_the_pack_sees(props: dict[str, Any]) -> Any:
    """Props as pulumi_policy hands them to a policy, in `up` as in preview: its read-only proxies, whose lists are
    no `list` and whose unknown values raise when read."""
    return unknown_checking_proxy(deserialize_properties(props))


def resource_args(resource_type: str, props: dict[str, Any]) -> ResourceValidationArgs:
    return ResourceValidationArgs(resource_type, as_the_pack_sees(props), f"urn:{resource_type}", "r", OPTS, None)


def policy_resource(resource: Declared, props: dict[str, Any] | None = None) -> PolicyResource:
    return PolicyResource(
        resource.type, as_the_pack_sees(props or resource.inputs), resource.urn, resource.name, OPTS, None, None, [], {}
    )


class Collected(list[str]):
    def __call__(self, message: str, urn: str | None = None) -> None:
        self.append(message)
