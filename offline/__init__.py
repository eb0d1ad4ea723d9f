"""Offline tools: run the Pulumi program under Pulumi's mocks (render, diff, bench). Need requirements.txt."""
