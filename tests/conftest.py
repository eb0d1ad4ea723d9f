from __future__ import annotations

import pytest

from offline.program import ProgramRun, run_program
from tests.support.stacks import valid_config


@pytest.fixture(scope="module")
def run() -> ProgramRun:
    return run_program(valid_config(), "test")
