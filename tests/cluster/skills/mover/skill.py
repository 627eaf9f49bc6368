"""Calls the transfer interface with arguments from the test, reporting denials as data."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skilld_sdk import HostError, Skill, transfer

skill = Skill()


def _report(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"ok": fn()}
    except HostError as exc:
        return {"error": exc.code, "rule": exc.rule, "message": exc.message}


@skill.method
def nodes() -> dict[str, Any]:
    """The nodes this skill may transfer with."""
    return _report(transfer.nodes)


@skill.method
def send(node: str, local_path: str, remote_path: str) -> dict[str, Any]:
    """Push a local file to another node."""
    return _report(lambda: transfer.send(node, local_path, remote_path))


@skill.method
def fetch(node: str, remote_path: str, local_path: str) -> dict[str, Any]:
    """Pull a file from another node."""
    return _report(lambda: transfer.fetch(node, remote_path, local_path))
