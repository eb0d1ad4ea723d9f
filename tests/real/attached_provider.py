"""package/'s component provider, started by the real tier and attached to the engine (PULUMI_DEBUG_PROVIDERS)
instead of launched by Pulumi's Python language host, which the module proxy does not serve.

    python -m tests.real.attached_provider ENGINE_ADDRESS     # prints the port it serves on

Attached, the engine calls Handshake and Attach (the engine's address) first; the Python SDK's provider
server (3.272.0, pulumi/provider/server.py) implements neither, so this adds both. And the schema names the
kubernetes provider the tier runs: the analyzer names the version of the SDK installed (pulumi_kubernetes'
pulumi-plugin.json, 4.34.2; pulumi/provider/experimental/analyzer.py, get_dependency_for_type), the module proxy
serves only v4.25.0 of the provider, and YAML's binder takes a resource reference only from the version it names
(pulumi/pkg v3.206.0 codegen/schema/loader.go:245-296, LoadPackageReferenceV2; the check at 282). The Python program meets the
same substitution without a check: the engine runs the provider on PATH whatever the version. Construct, the
rest of the schema and the components are package/'s own.
"""

import dataclasses
import os
from pathlib import Path
from typing import Any

from google.protobuf import empty_pb2  # type: ignore[import-untyped]
from pulumi.provider import server
from pulumi.provider.experimental import analyzer, component_provider_host
from pulumi.runtime.proto import provider_pb2

from common.names import PROJECT
from e2e.build import LINKS
from package.__main__ import COMPONENTS, VERSION

# "pk8s v4.25.0": what e2e.build wrote beside the provider it built.
TIER_PROVIDER = (Path(os.path.realpath(LINKS / "pulumi-resource-kubernetes")).parent / "VERSION").read_text().split()[1]
_dependency = analyzer.get_dependency_for_type


def _tier_dependency(arg: type) -> analyzer.Dependency:
    found = _dependency(arg)
    if found.name != "kubernetes":
        return found
    return dataclasses.replace(found, version=TIER_PROVIDER.removeprefix("v"))


async def _handshake(self: Any, request: Any, context: Any) -> Any:
    return provider_pb2.ProviderHandshakeResponse(accept_secrets=True, accept_resources=True, accept_outputs=True)


async def _attach(self: Any, request: Any, context: Any) -> Any:
    self.engine_address = request.address  # where Construct's resources log
    return empty_pb2.Empty()


setattr(server.ProviderServicer, "Handshake", _handshake)  # noqa: B010 - patching the SDK's class on purpose
setattr(server.ProviderServicer, "Attach", _attach)  # noqa: B010
setattr(analyzer, "get_dependency_for_type", _tier_dependency)  # noqa: B010

if __name__ == "__main__":
    component_provider_host(COMPONENTS, name=PROJECT, version=VERSION)
