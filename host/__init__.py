"""GPU-host tools (discover, audit): only requirements-host.txt. Never import pulumi or kubernetes here."""

# First, before any module of this package imports its dependencies (cel, pulumi, kubernetes): common.cli
# installs the hook that ends a Ctrl-C during start-up without a traceback (`python -m host.<tool>`).
import common.cli  # noqa: F401
