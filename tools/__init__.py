"""Command-line tools: the offline render (needs Pulumi) and the GPU-host tools (do not)."""
