"""GPU-host tools (discover, audit): only requirements-host.txt. Never import pulumi or kubernetes here."""

# First, before any other module loads: the hook that ends a Ctrl-C during start-up without a traceback
# (`python -m host.<tool>`).
import common.quiet_start  # noqa: F401
