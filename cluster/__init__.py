"""Cluster tools: read the live API server with the kubernetes client (verify). Need requirements.txt."""
