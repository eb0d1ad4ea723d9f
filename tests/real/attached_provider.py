"""package/'s component provider, started by the real tier and attached to the engine (PULUMI_DEBUG_PROVIDERS)
instead of launched by Pulumi's Python language host, which the module proxy does not serve.

    python -m tests.real.attached_provider ENGINE_ADDRESS     # prints the port it serves on

Attached, the engine calls Handshake and Attach (the engine's address) first; the Python SDK's provider
server (3.272.0, pulumi/provider/server.py) implements neither, so this adds both, and nothing else:
Construct, the schema and the components are package/'s own.
"""

from typing import Any

from google.protobuf import empty_pb2  # type: ignore[import-untyped]
from pulumi.provider import server
from pulumi.provider.experimental import component_provider_host
from pulumi.runtime.proto import provider_pb2

from common.names import PROJECT
from package.__main__ import COMPONENTS, VERSION


async def _handshake(self: Any, request: Any, context: Any) -> Any:
    return provider_pb2.ProviderHandshakeResponse(accept_secrets=True, accept_resources=True, accept_outputs=True)


async def _attach(self: Any, request: Any, context: Any) -> Any:
    self.engine_address = request.address  # where Construct's resources log
    return empty_pb2.Empty()


setattr(server.ProviderServicer, "Handshake", _handshake)  # noqa: B010 - patching the SDK's class on purpose
setattr(server.ProviderServicer, "Attach", _attach)  # noqa: B010

if __name__ == "__main__":
    component_provider_host(COMPONENTS, name=PROJECT, version=VERSION)
