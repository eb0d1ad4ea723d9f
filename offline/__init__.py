"""Offline tools: run the Pulumi program under Pulumi's mocks (render, diff, bench). Need requirements.txt."""

# First, before any other module loads: the hook that ends a Ctrl-C during start-up without a traceback
# (`python -m offline.<tool>`).
import common.quiet_start  # noqa: F401
