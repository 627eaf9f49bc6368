"""The seccomp layer as the runner sees it: compiled once per set of flags, in the host.

``_seccomp.py`` (beside this module) builds the BPF program with libseccomp and installs
it in the confined process; where its binding or libseccomp is missing, no filter is
available, :mod:`skilld.confine._client`'s profile says so and commands are refused.
"""

from __future__ import annotations

from skilld.confine import _seccomp
from skilld.errors import SkilldError


def program(
    *,
    unix_sockets: bool,
    udp: bool,
    metadata: bool,
    local_sockets: bool = False,
    ipc: bool = True,
) -> bytes | None:
    """The filter's BPF bytes for these flags, or ``None`` when there is no seccomp layer
    (``compile_filter`` keeps each program it built: this is called per command)."""
    try:
        return bytes(
            _seccomp.compile_filter(
                unix_sockets=unix_sockets,
                udp=udp,
                metadata=metadata,
                local_sockets=local_sockets,
                ipc=ipc,
            )
        )
    except (ImportError, OSError, RuntimeError, ValueError, SkilldError):
        # The binding or libseccomp is missing here: no seccomp layer (the profile says so).
        return None


def available() -> bool:
    """Whether a filter can be compiled here."""
    return program(unix_sockets=False, udp=False, metadata=False) is not None


def names_socket(paths: tuple[str, ...]) -> bool:
    """Whether a grant names a unix socket (then the filter lets ``socket(AF_UNIX)``
    through, and file modes and Landlock are the walls for it)."""
    return bool(_seccomp.names_socket(paths))


def why_not() -> str:
    """What keeps the filter from being built here (for an error's hint)."""
    try:
        ok, text = _seccomp.available()
    except Exception as exc:  # noqa: BLE001 - only ever reported as text
        return str(exc)
    return "" if ok else str(text)
