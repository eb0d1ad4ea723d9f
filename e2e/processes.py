"""The testbed's process supervisor, shared by the control plane and the node: each child in its own session (a
signal reaches what it started too), its output appended to `<root>/<name>.log`, its command kept for a restart,
and all of them stopped one by one in the reverse of their start."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Processes:
    root: Path
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    commands: dict[str, list[str]] = field(default_factory=dict)
    envs: dict[str, dict[str, str] | None] = field(default_factory=dict)

    def __contains__(self, name: object) -> bool:
        return name in self.running

    def spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        """Start `name` (None: this process's environment); a name started before is replaced."""
        self.commands[name], self.envs[name] = command, env
        with (self.root / f"{name}.log").open("ab") as log:  # the child keeps its own descriptor
            self.running[name] = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self, name: str) -> None:
        """SIGKILL, as a crash or a lost machine ends a process: no graceful shutdown. It stays listed, exited."""
        process = self.running[name]
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def restart(self, name: str) -> None:
        """Kill `name` and start it again with its first command line and environment."""
        self.kill(name)
        self.spawn(name, self.commands[name], self.envs[name])

    def terminate(self, name: str, seconds: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `seconds`; `name` is forgotten: a process stopped on purpose is no failure
        for exited() to report. Nothing happens for a name not running."""
        process = self.running.pop(name, None)
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(seconds)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def stop(self, seconds: float = 10.0) -> None:
        """Every process, newest first, each gone before the next is asked: a server stopped beside the store it
        needs (the API server beside etcd) hangs in its graceful shutdown until killed."""
        for name in reversed(list(self.running)):
            self.terminate(name, seconds)

    def exited(self) -> str | None:
        """`<name> exited (<status>): <its log's end>` for the first listed process that has exited, else None."""
        for name, process in self.running.items():
            if process.poll() is not None:
                return f"{name} exited ({process.returncode}): {self.log(name)[-3000:]}"
        return None
