"""Cluster tools: read the live API server with the kubernetes client (verify). Need requirements.txt."""

# First, before any other module loads: the hook that ends a Ctrl-C during start-up without a traceback
# (`python -m cluster.<tool>`).
import common.quiet_start  # noqa: F401
