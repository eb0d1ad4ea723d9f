from __future__ import annotations

import os
import socket

import pytest
from hypothesis import settings

from offline.program import ProgramRun, run_program
from tests.support.stacks import valid_config


@pytest.fixture(scope="module")
def run() -> ProgramRun:
    return run_program(valid_config(), "test")


# CI runs the property tests with a fixed seed and no example database: a red run repeats.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def unused_port() -> int:
    """A loopback port nobody listens on, for a server the test starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# The real tiers, by directory: marked `real` (make test deselects them) with a time limit of their own. The longest
# real-tier test (the lifecycle) takes about a minute, a plugin roll on the node tier ten seconds; a Pulumi await
# that cannot end takes ten minutes.
REAL_TIERS = {"tests/real/": 300, "tests/node/": 300}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for directory, limit in REAL_TIERS.items():
            if directory in str(item.path):
                item.add_marker(pytest.mark.real)
                item.add_marker(pytest.mark.timeout(limit))
