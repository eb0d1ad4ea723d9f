"""How many examples a property test draws: its full count under `make test-all` (which .ci/run runs),
a twentieth of it, at least 20, under `make test`, so the fast tier stays fast and the full runs still run."""

from __future__ import annotations

import os

THOROUGH = os.environ.get("HIDDEN_GPU_PROPERTIES") == "thorough"


def examples(full: int) -> int:
    return full if THOROUGH else max(20, full // 20)
