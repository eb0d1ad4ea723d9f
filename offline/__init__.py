"""Offline tools: run the Pulumi program under Pulumi's mocks (render, diff, bench). Need requirements.txt."""

# First, before any module of this package imports its dependencies (cel, pulumi, kubernetes): common.cli
# installs the hook that ends a Ctrl-C during start-up without a traceback (`python -m offline.<tool>`).
import common.cli  # noqa: F401
