"""Cluster tools: read the live API server with the kubernetes client (verify). Need requirements.txt."""

# First, before any module of this package imports its dependencies (cel, pulumi, kubernetes): common.cli
# installs the hook that ends a Ctrl-C during start-up without a traceback (`python -m cluster.<tool>`).
import common.cli  # noqa: F401
