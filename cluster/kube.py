"""A kubernetes client for the stack's own cluster: its `kubernetes:context` and `kubernetes:kubeconfig`
unless the command line says otherwise, so a check never reads whatever cluster happens to be current."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError

from common.cli import (
    SHOWN_PATH_CHARS,
    UnavailableError,
    UsageError,
    bounded,
    captured_log,
    positive_seconds,
    stack_name_of,
)

if TYPE_CHECKING:
    from kubernetes import client

# Seconds: connect, then read; a check that cannot see must say so, not hang.
TIMEOUTS = (5.0, 30.0)
# Items per LIST page: a 1,000-node fleet is one request per kind.
PAGE = 1000
KUBECONFIG_KEY = "kubernetes:kubeconfig"


def add_cluster_options(arguments: argparse.ArgumentParser) -> None:
    arguments.add_argument("--kubeconfig", help="default: the stack's kubernetes:kubeconfig, else as kubectl finds it")
    arguments.add_argument("--context", help="default: the stack's kubernetes:context, else the current context")


def api_client(args: argparse.Namespace, stack_config: Mapping[str, Any]) -> client.ApiClient:
    """A client for the cluster the stack names; --kubeconfig/--context override the stack's keys.

    Called before the first request: a --deadline that would end every wait before it starts, or never, is
    refused here (argparse takes `nan`, `inf` and `-1` as floats)."""
    deadline = getattr(args, "deadline", None)
    if deadline is not None and not isinstance(deadline, str):
        try:
            positive_seconds(str(deadline))
        except argparse.ArgumentTypeError as error:
            raise UsageError(f"--deadline {error}") from None
    context = args.context or stack_config.get("kubernetes:context")
    kubeconfig = args.kubeconfig or stack_kubeconfig(stack_config)
    where = f"kubeconfig (context {context or 'current'})"
    # Imported here, inside the tool's error path: the client takes a second to import, and a Ctrl-C meanwhile
    # is then an interrupted command (130), not a traceback.
    from kubernetes import client, config  # noqa: PLC0415
    from kubernetes.config.config_exception import ConfigException  # noqa: PLC0415

    configuration = client.Configuration()
    try:
        # The client runs an exec credential plugin here, and reports its failure only by logging it.
        with captured_log(logging.ERROR) as failures:
            if isinstance(kubeconfig, str) and "\n" in kubeconfig:  # the key may hold the file's content
                loaded = yaml.safe_load(kubeconfig)
                config.load_kube_config_from_dict(loaded, context=context, client_configuration=configuration)  # type: ignore[no-untyped-call]
            else:
                path = str(Path(kubeconfig).expanduser()) if kubeconfig else None
                if path is not None and not Path(path).is_file():
                    # The client would say "Invalid kube-config file. No configuration found."
                    source = "--kubeconfig" if args.kubeconfig else KUBECONFIG_KEY
                    raise UsageError(f"{source} {bounded(path, SHOWN_PATH_CHARS)}: no such file")
                config.load_kube_config(config_file=path, context=context, client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, yaml.YAMLError, TypeError, ValueError) as error:  # ValueError: not UTF-8
        raise UsageError(f"{where}: {error}") from None
    if failures:
        said = bounded(failures[0].getMessage(), 200)
        missing = "No such file or directory" in said
        hint = "not installed, or not on PATH" if missing else "it failed (logged in? its own output says more)"
        raise UsageError(f"{where}: its exec credential plugin: {hint}: {said}")
    configuration.retries = False  # the callers retry, with backoff and a deadline
    return client.ApiClient(configuration)


def stack_kubeconfig(stack_config: Mapping[str, Any]) -> str | None:
    """The stack's `kubernetes:kubeconfig` (a path, or the file's content). A Pulumi secret (`{secure: ...}`)
    only the Pulumi CLI can decrypt: the KUBECONFIG the environment names is taken instead, said in one line,
    or the command is refused with what to do. --kubeconfig, given, is taken before this is asked."""
    value = stack_config.get(KUBECONFIG_KEY)
    if value is None or isinstance(value, str):
        return value
    line = getattr(stack_config, "key_lines", {}).get(KUBECONFIG_KEY)
    where = f"{stack_config.path}:{line}: {KUBECONFIG_KEY}" if line else KUBECONFIG_KEY  # type: ignore[attr-defined]
    if not (isinstance(value, dict) and set(value) == {"secure"}):
        raise UsageError(f"{where} = {bounded(json.dumps(value, default=str))}: a kubeconfig's path or content")
    environment = os.environ.get("KUBECONFIG")
    if environment:
        print(
            f"note: {where} is a Pulumi secret this tool cannot decrypt: using KUBECONFIG "
            f"({bounded(environment, SHOWN_PATH_CHARS)}) for the stack's cluster",
            file=sys.stderr,
        )
        return environment  # read now: the client reads the variable once, when it is imported
    stack = f" --stack {stack_name_of(Path(stack_config.path))}" if line else ""  # type: ignore[attr-defined]
    raise UsageError(
        f"{where} = {{secure: ...}}: a Pulumi secret, which only the Pulumi CLI decrypts: give the cluster's "
        f"kubeconfig with --kubeconfig FILE (or KUBECONFIG=FILE), e.g. after "
        f"`pulumi config get {KUBECONFIG_KEY}{stack} > FILE`"
    )


class _NotFoundError(UnavailableError):
    """A 404: unavailable to a caller that needs the object, an answer to one that asks with find()."""


class ForbiddenError(UnavailableError):
    """A 403: the identity may not read this."""


class UnansweredError(UnavailableError):
    """A write that was sent and not answered (the connection dropped, the answer never came before the
    deadline): the API server may have applied it. Only a new read says whether it did."""


def _never_sent(error: HTTPError) -> bool:
    """A connection that was never made: the request cannot have reached the API server."""
    reason = getattr(error, "reason", None)
    return any(isinstance(e, (NewConnectionError, ConnectTimeoutError)) for e in (error, reason))


@dataclass
class Reader:
    """GETs against the API server with timeouts, an overall deadline, and retries of 429 and 5xx
    with backoff; an answer that is not the JSON object asked for is UnavailableError, never a crash."""

    client: client.ApiClient
    deadline: float
    retries: int = 3
    backoff: float = 0.2
    requests: int = 0

    def find(self, path: str) -> dict[str, Any] | None:
        """The object at `path`, or None where the API server answers 404."""
        try:
            return self.get(path)
        except _NotFoundError:
            return None

    def get(self, path: str, query: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        for attempt in range(self.retries + 1):
            try:
                status, reason, data = self._call("GET", path, query or [])
            except HTTPError as error:
                if attempt == self.retries:
                    raise UnavailableError(f"cannot reach the API server: {bounded(str(error))}") from None
                self._sleep(self.backoff * 2**attempt)
                continue
            if status == 429 or status >= 500:
                if attempt == self.retries:
                    raise UnavailableError(f"the API server answered {status} to GET {path}, {attempt + 1} times")
                self._sleep(self.backoff * 2**attempt)
                continue
            if status == 404:
                raise _NotFoundError(f"the API server answered 404 {reason} to GET {path}")
            if status == 403:
                raise ForbiddenError(f"the API server answered 403 {reason} to GET {path}")
            if status != 200:
                raise UnavailableError(f"the API server answered {status} {reason} to GET {path}")
            return _json_object(data, path)
        raise AssertionError("unreachable")

    def apply(
        self, path: str, body: Mapping[str, Any], field_manager: str, until: float | None = None
    ) -> dict[str, Any]:
        """One server-side apply of `body` as `field_manager`, not forced, answered by `until` (default: the
        deadline); a refusal is UnavailableError, a request sent and not answered UnansweredError."""
        return self._patch(path, body, [("fieldManager", field_manager)], "application/apply-patch+yaml", until)

    def merge_patch(self, path: str, body: Mapping[str, Any], field_manager: str) -> dict[str, Any]:
        """One JSON merge patch (RFC 7386: a null removes the key) as `field_manager`; errors as apply()'s."""
        return self._patch(path, body, [("fieldManager", field_manager)], "application/merge-patch+json", None)

    def _patch(
        self, path: str, body: Mapping[str, Any], query: list[tuple[str, str]], content_type: str, until: float | None
    ) -> dict[str, Any]:
        headers = {"Content-Type": content_type}
        try:
            status, reason, data = self._call("PATCH", path, query, dict(body), headers, until=until)
        except HTTPError as error:
            if _never_sent(error):
                raise UnavailableError(f"cannot reach the API server: {bounded(str(error))}") from None
            raise UnansweredError(f"the API server did not answer PATCH {path}: {bounded(str(error))}") from None
        if status != 200:
            message = _json_object(data, path).get("message", "") if data.startswith(b"{") else ""
            raise UnavailableError(
                f"the API server answered {status} {reason} to PATCH {path}: {bounded(message, 200)}"
            )
        return _json_object(data, path)

    def _sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, min(seconds, self.deadline - time.monotonic())))

    def _call(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        *,
        until: float | None = None,
    ) -> tuple[int, str, bytes]:
        """(status, reason, body) of one request, all of it before the deadline (or `until`, when sooner): a
        server that drips its answer a byte at a time never trips a socket's read timeout, so the whole call
        runs in a daemon thread that is abandoned at the deadline."""
        remaining = min(self.deadline, until if until is not None else self.deadline) - time.monotonic()
        if remaining <= 0:
            raise UnavailableError(f"the API server did not answer {method} {path} before the deadline")
        serialized = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query,
            header_params=headers or {},
            body=body,
            auth_settings=["BearerToken"],
        )
        self.requests += 1
        outcome: list[tuple[int, str, bytes] | BaseException] = []

        def call() -> None:
            try:
                response = self.client.call_api(
                    *serialized, _request_timeout=(TIMEOUTS[0], min(TIMEOUTS[1], remaining))
                )
                outcome.append((response.status, str(response.reason), response.read()))  # type: ignore[no-untyped-call]
            except BaseException as error:  # handed to the caller's thread
                outcome.append(error)

        worker = threading.Thread(target=call, name=f"{method} {path}", daemon=True)
        worker.start()
        worker.join(remaining)
        if not outcome:
            unanswered = UnansweredError if method != "GET" else UnavailableError
            raise unanswered(f"the API server did not finish answering {method} {path} before the deadline")
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def list(
        self, path: str, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Every item of a collection, in pages of PAGE."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            query = [("limit", str(PAGE))] + ([("labelSelector", label_selector)] if label_selector else [])
            query += [("fieldSelector", field_selector)] if field_selector else []
            page = self.get(path, query + ([("continue", token)] if token else []))
            found = page.get("items")
            if not isinstance(found, list) or not all(
                isinstance(i, dict) and isinstance(i.get("metadata"), dict) for i in found
            ):
                raise UnavailableError(f"malformed answer to GET {path}: no list of objects")
            items += found
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items


def _json_object(data: bytes, path: str) -> dict[str, Any]:
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        raise UnavailableError(f"malformed answer to GET {path}: not JSON") from None
    if not isinstance(parsed, dict):
        raise UnavailableError(f"malformed answer to GET {path}: not an object")
    return parsed
