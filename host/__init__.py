"""GPU-host tools (discover, audit): only requirements-host.txt. Never import pulumi or kubernetes here."""
