"""Permission checkers for tests that decide by text triples instead of compiled tables."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from skilld.types import Decision


class TextQuestions:
    """The typed questions of :class:`~skilld.types.PermissionChecker`, put to ``check``.

    A test checker lists (capability, action, target) triples; this base writes each
    typed question as the triple it stands for (``fs.read|write`` PATH, ``http.METHOD``
    URL, ``shell.run`` as ``shlex.join(argv)``, ``*.address`` as ``IP:PORT HOST``,
    ``tcp.connect`` as ``HOST:PORT``). Only tests do this: the host asks the real
    checker typed.
    """

    def check(self, capability: str, action: str, target: str) -> Decision:
        """Decide a triple (each test checker's own rule)."""
        raise NotImplementedError

    def check_path(self, path: str, write: bool = False, *, action: str | None = None) -> Decision:
        """``fs.read`` / ``fs.write`` (or ``action``) of ``path``."""
        return self.check("fs", action or ("write" if write else "read"), path)

    def check_url(self, url: str, method: str = "GET") -> Decision:
        """``http.METHOD`` of ``url``."""
        return self.check("http", method, url)

    def check_argv(self, argv: Sequence[str], cwd: str | None = None) -> Decision:
        """``shell.run``, as ``shlex.join(argv)``."""
        return self.check("shell", "run", shlex.join(argv))

    def check_address(
        self, ip: str, port: int, capability: str = "http", host: str | None = None
    ) -> Decision:
        """``http.address`` / ``tcp.address``, as ``IP:PORT HOST``."""
        addr = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        return self.check(capability, "address", f"{addr} {host}" if host else addr)

    def check_tcp(self, host: str, port: int) -> Decision:
        """``tcp.connect``, as ``HOST:PORT``."""
        return self.check("tcp", "connect", f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
