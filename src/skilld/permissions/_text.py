"""Permission questions written as text, for people (``skilld policy explain``, tests).

The host asks typed (``check_path(path, write)``, ``check_url(url, method)``,
``check_argv(argv)``, ``check_address(ip, port, capability, host)``, ``check_tcp(host,
port)``); a person writes ``fs.write /data/x``, ``http.get URL``, ``shell.run "git status"``
or ``tcp.connect db.internal:5432``. :func:`check_text` splits such text once, here, and
asks the typed question: no text travels between the host and the checker.
"""

from __future__ import annotations

import re
import shlex

from skilld.permissions._checker import FS_READ_ACTIONS, FS_WRITE_ACTIONS, SkillPermissions
from skilld.types import Decision

# One shell word: runs of anything but whitespace and quotes, and '...' pairs.
_SHELL_WORD = re.compile(r"(?:[^ \t\r\n']+|'[^']*')+")


def _split_argv(target: str) -> list[str]:
    """``shlex.split(target)``, without shlex's cost for what ``shlex.join`` writes.

    Without double quotes or backslashes, and with single quotes in pairs, shlex
    splits on its four whitespace characters and drops the quotes; so does this.

    Raises:
        ValueError: an unclosed quote (from shlex).
    """
    if '"' in target or "\\" in target or target.count("'") % 2:
        return shlex.split(target)
    return [word.replace("'", "") for word in _SHELL_WORD.findall(target)]


def _split_hostport(target: str) -> tuple[str, int]:
    if target.startswith("["):
        end = target.find("]")
        host, rest = target[1:end], target[end + 1 :]
    else:
        host, sep, port_text = target.rpartition(":")
        rest = sep + port_text
        if ":" in host:
            raise ValueError(f"an IPv6 address needs brackets: {target!r}")
    if not rest.startswith(":") or not rest[1:].isdigit() or not host:
        raise ValueError(f"expected HOST:PORT, got {target!r}")
    port = int(rest[1:])
    if not 1 <= port <= 65535:
        raise ValueError(f"port out of range in {target!r}")
    return host, port


def check_text(checker: SkillPermissions, capability: str, action: str, target: str) -> Decision:
    """Decide a question written as text.

    ``fs.ACTION`` takes a path, ``http.METHOD`` a URL (any case), ``shell.run`` a command
    line (split like a shell would, then checked as argv), ``tcp.connect`` ``HOST:PORT``,
    ``http.address`` and ``tcp.address`` ``IP:PORT [HOST]`` (IPv6 in brackets);
    everything else is :meth:`SkillPermissions.check`'s. A malformed
    target is refused with rule ``bad-request``, never raised.
    """
    if capability == "fs" and (action in FS_READ_ACTIONS or action in FS_WRITE_ACTIONS):
        return checker.check_path(target, write=action in FS_WRITE_ACTIONS, action=action)
    if capability == "http" and action != "address":
        return checker.check_url(target, action.upper())
    try:
        if capability == "shell" and action == "run":
            return checker.check_argv(_split_argv(target))
        if capability == "tcp" and action == "connect":
            return checker.check_tcp(*_split_hostport(target))
        if capability in ("http", "tcp") and action == "address":
            addr, _, host = target.partition(" ")
            ip, port = _split_hostport(addr)
            return checker.check_address(ip, port, capability, host or None)
    except ValueError as exc:
        reason = f"malformed request: {exc}"
        return Decision(False, capability, action, target, "bad-request", reason)
    return checker.check(capability, action, target)
