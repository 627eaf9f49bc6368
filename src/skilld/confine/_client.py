"""The host's side of the launcher: starting it once, handing it commands, the active profile.

One launcher per process (``_launcher.py``, see its docstring), started by :func:`start`
(``skilld serve`` calls it before it takes calls; :func:`launcher` starts it on first use
otherwise). A command is handed over as one ``SOCK_SEQPACKET`` message on the control
socket carrying four descriptors (the call socket, stdin, stdout, stderr); the send is the
only shared step and holds a lock, everything else of a call is on its own descriptors,
so concurrent :func:`~skilld.confine.run` calls do not wait for each other. A launcher
that died is restarted by the next call; one that cannot be restarted with the same
identity mode fails the call closed.
"""

from __future__ import annotations

import array
import contextlib
import marshal
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skilld.confine import _identity
from skilld.confine import _launcher as la
from skilld.errors import ConfinementUnavailable

LAUNCHER = str(Path(la.__file__).resolve())
RUN_AS_ENV = "SKILLD_RUN_AS"
# Tests set this to ``0`` to act as a platform where no namespace can be made (Docker's
# default seccomp profile, no CAP_SYS_ADMIN): it can only take a wall away.
NAMESPACES_ENV = "SKILLD_CONFINE_NAMESPACES"
# Tests set this to ``shared`` to run commands as the launcher's own uid (the metadata
# rules of the seccomp filter then apply, as for an unprivileged skilld); never set it
# in production: as root, a shared identity means uid 0 without capabilities, which
# RLIMIT_NPROC does not bound (the launcher then counts each tree's tasks itself, every
# 10 ms: a bound that overshoots by what forks in one interval).
IDENTITY_ENV = "SKILLD_CONFINE_IDENTITY"
_HELLO_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Profile:
    """The confinement a command gets on this node, layer by layer.

    ``identity`` is ``separate`` (each call's processes run as a uid of their own, from
    their skill's slot of ``uids``, in the skill's group) or ``shared`` (as skilld's uid:
    the seccomp filter then refuses metadata changes and every call on another pid, and
    state, audit and bundle are outside every Landlock rule).
    ``namespaces`` lists the extra walls made per command (``net``, ``ipc``), maybe none.
    ``runnable`` is False, with ``reason``, when native commands are refused here.
    """

    identity: str
    uids: tuple[int, int]
    launcher_uid: int
    landlock_abi: int
    seccomp: bool
    namespaces: tuple[str, ...]
    reaper: str
    runnable: bool
    reason: str | None = None

    def describe(self) -> str:
        """One line for the start-up banner, the log and ``/readyz``."""
        ident = (
            f"separate (a uid per call from {self.uids[0]}-{self.uids[1]})"
            if self.identity == "separate"
            else f"shared (uid {self.launcher_uid})"
        )
        line = (
            f"identity {ident}, landlock ABI {self.landlock_abi}, "
            f"seccomp {'on' if self.seccomp else 'off'}, "
            f"namespaces {'+'.join(self.namespaces) or 'none'}, reaper {self.reaper}"
        )
        return line if self.runnable else f"{line}; native commands refused: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        """The profile as JSON-ready values."""
        return {
            "identity": self.identity,
            "uids": list(self.uids),
            "landlock_abi": self.landlock_abi,
            "seccomp": self.seccomp,
            "namespaces": list(self.namespaces),
            "reaper": self.reaper,
            "runnable": self.runnable,
            "reason": self.reason,
        }


class Launcher:
    """One running launcher process and its control socket."""

    def __init__(self, run_as: tuple[int, int] | None = None):
        """Start it and read its hello.

        Raises:
            ConfinementUnavailable: it could not be started, or could not take ``run_as``.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-I", "-S", LAUNCHER, str(theirs.fileno())]
        if run_as is not None:
            argv.append(f"{run_as[0]}:{run_as[1]}")
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                # Its failures reach the host as status lines; a stray traceback must
                # not break a JSON log on stderr.
                stderr=subprocess.DEVNULL,
                env={},
                cwd="/",
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise ConfinementUnavailable(
                f"cannot start the confinement launcher: {exc}", feature="launcher"
            ) from exc
        finally:
            theirs.close()
        self.ctl = ours
        self.lock = threading.Lock()
        ours.settimeout(_HELLO_TIMEOUT_S)
        try:
            data = ours.recv(1 << 16)
            hello: dict[str, Any] = marshal.loads(data) if data else {"error": "no hello"}  # noqa: S302 - our child
        except (OSError, ValueError, EOFError) as exc:
            hello = {"error": f"no hello ({exc})"}
        ours.settimeout(None)
        if "error" in hello:
            self.close()
            raise ConfinementUnavailable(
                f"the confinement launcher could not start: {hello['error']}", feature="launcher"
            )
        self.hello = hello
        self.run_as = run_as

    @property
    def alive(self) -> bool:
        """The launcher process has not ended."""
        return self.proc.poll() is None

    def send(self, fds: tuple[int, ...]) -> None:
        """Hand one command's descriptors over.

        Raises:
            OSError: the launcher is gone.
        """
        with self.lock:
            rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))
            self.ctl.sendmsg([b"R"], [rights])

    def close(self) -> None:
        """End the launcher (its running commands see their host go and end their trees)."""
        with contextlib.suppress(OSError):
            self.ctl.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_lock = threading.Lock()
_state: dict[str, Any] = {"launcher": None, "run_as": None, "identity": None}


def run_as_from_env() -> tuple[int, int] | None:
    """``SKILLD_RUN_AS`` (``UID`` or ``UID:GID``) as a pair, or ``None`` when unset.

    Raises:
        ConfinementUnavailable: malformed, or root.
    """
    text = os.environ.get(RUN_AS_ENV, "").strip()
    if not text:
        return None
    uid, _, gid = text.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()) or int(uid) == 0:
        raise ConfinementUnavailable(
            f"{RUN_AS_ENV}={text!r} is not UID or UID:GID of an unprivileged user",
            feature="identity",
        )
    return int(uid), int(gid or uid)


def start(run_as: tuple[int, int] | None = None) -> Launcher:
    """Start this process's launcher now (once); with ``run_as``, the launcher takes that
    identity keeping only CAP_SETUID, CAP_SETGID and CAP_CHOWN (skilld must be root).

    Raises:
        ConfinementUnavailable: the launcher could not start.
    """
    with _lock:
        current: Launcher | None = _state["launcher"]
        if current is not None and current.alive:
            return current
        return _restart(run_as)


def start_from_env() -> None:
    """What ``skilld serve`` and ``skilld doctor`` do first, before any thread: start
    the launcher; with ``SKILLD_RUN_AS`` (skilld started as root, as in the image) the
    launcher keeps only CAP_SETUID, CAP_SETGID and CAP_CHOWN and this process becomes
    that user with no capability at all. Without it, a launcher that cannot start is
    not an error here (commands are refused later, naming why).

    Raises:
        ConfinementUnavailable: ``SKILLD_RUN_AS`` is malformed, skilld is neither root
            nor already that user, or the switch failed.
    """
    run_as = run_as_from_env()
    if run_as is None:
        with contextlib.suppress(ConfinementUnavailable):
            start()
        return
    if os.geteuid() != 0 and os.getuid() == run_as[0] and os.getgid() == run_as[1]:
        # Already that user (Kubernetes' restricted profile: --user 10001 on an image whose
        # SKILLD_RUN_AS is 10001): nothing to drop; the launcher finds no separate identity.
        with contextlib.suppress(ConfinementUnavailable):
            start()
        return
    if os.geteuid() != 0:
        raise ConfinementUnavailable(
            f"{RUN_AS_ENV} is set but skilld is not root: start it as root (the launcher "
            "keeps CAP_SETUID/CAP_SETGID/CAP_CHOWN, the server none) or unset it",
            feature="identity",
        )
    start(run_as)
    drop_privileges(*run_as)


def _restart(run_as: tuple[int, int] | None) -> Launcher:
    old: Launcher | None = _state["launcher"]
    if old is not None:
        old.close()
        run_as = old.run_as
    fresh = Launcher(run_as)
    identity = identity_mode(fresh.hello)
    if _state["identity"] not in (None, identity):
        fresh.close()
        _state["launcher"] = None
        raise ConfinementUnavailable(
            "the confinement launcher ended and its replacement cannot switch identities "
            f"as the first one did ({identity} instead of {_state['identity']}); commands "
            "are refused until skilld is restarted",
            feature="launcher",
            hint="restart skilld",
        )
    _state.update(launcher=fresh, run_as=run_as, identity=identity)
    return fresh


def launcher() -> Launcher:
    """The running launcher, started (or restarted) if needed.

    Raises:
        ConfinementUnavailable: it could not be (re)started.
    """
    with _lock:
        current: Launcher | None = _state["launcher"]
        if current is not None and current.alive:
            return current
        return _restart(run_as_from_env() if current is None else current.run_as)


def restart_if(dead: Launcher) -> Launcher:
    """A new launcher when ``dead`` is still the current one (a send to it failed).

    Raises:
        ConfinementUnavailable: it could not be restarted.
    """
    with _lock:
        if _state["launcher"] is dead:
            return _restart(dead.run_as)
        current: Launcher = _state["launcher"]
        return current


def shutdown() -> None:
    """End this process's launcher (tests; a server's exit ends it anyway)."""
    with _lock:
        current: Launcher | None = _state["launcher"]
        _state.update(launcher=None, identity=None)
    if current is not None:
        current.close()


def identity_mode(hello: dict[str, Any]) -> str:
    """``separate`` when the launcher of ``hello`` can switch uids (root, or
    CAP_SETUID+CAP_SETGID+CAP_CHOWN), else ``shared``."""
    if os.environ.get(IDENTITY_ENV, "").strip() == "shared":
        return "shared"
    need = (1 << la.CAP_SETUID) | (1 << la.CAP_SETGID) | (1 << la.CAP_CHOWN)
    return "separate" if hello["uid"] == 0 or hello["caps"] & need == need else "shared"


def drop_privileges(uid: int, gid: int) -> None:
    """Make this (root) process ``uid``/``gid`` with no capability at all, no
    supplementary groups and an empty bounding set; call it before any thread starts
    (it changes this thread only).

    Raises:
        ConfinementUnavailable: the kernel refused.
    """
    if threading.active_count() > 1:
        raise ConfinementUnavailable(
            "cannot drop privileges: threads already run (they would keep root)",
            feature="identity",
        )
    try:
        la.drop_bounding_set()
        la.switch_identity(uid, gid)
        la.set_capabilities(0)
    except la.Unavailable as exc:
        raise ConfinementUnavailable(
            f"cannot drop skilld's privileges to uid {uid}: {exc.detail}", feature=exc.feature
        ) from exc


def namespaces(hello: dict[str, Any], seccomp: bool, abi: int) -> tuple[str, ...]:
    """The namespaces each command gets here, as extra walls: none where they cannot be
    made; an IPC namespace (about 0.1 ms); a network namespace (about 4 ms, most of a
    command's cost) only where the other walls leave a gap: no seccomp filter to refuse
    UDP, raw and netlink sockets, or no Landlock TCP rules (ABI 4)."""
    if not hello["namespaces"] or os.environ.get(NAMESPACES_ENV, "").strip() == "0":
        return ()
    return ("ipc",) if seccomp and abi >= 4 else ("net", "ipc")


def profile() -> Profile:
    """The confinement commands get here (starts the launcher if needed).

    Raises:
        ConfinementUnavailable: the launcher could not start.
    """
    from skilld.confine import _filters, _runner

    hello = launcher().hello
    abi = _runner.landlock_abi()
    identity = identity_mode(hello)
    seccomp = _filters.available() and bool(hello.get("seccomp"))
    spaces = namespaces(hello, seccomp, abi)
    reason = None
    try:
        uids = _identity.uid_range(forbidden_uids(hello))
    except ConfinementUnavailable as exc:
        uids, reason = (0, 0), exc.message
    if abi < _runner.MIN_ABI:
        reason = f"Landlock ABI {abi} (ABI {_runner.MIN_ABI} or later needed)"
    elif identity == "shared" and not seccomp:
        reason = "no separate identity and no seccomp filter to refuse metadata changes"
    elif "net" not in spaces and not seccomp:
        reason = "no network namespace and no seccomp filter to refuse UDP and raw sockets"
    elif "net" not in spaces and abi < 4:
        reason = f"no network namespace and Landlock ABI {abi} has no TCP rules (ABI 4)"
    elif identity == "shared" and abi < 6:
        reason = f"a shared uid, and Landlock ABI {abi} cannot scope signals (ABI 6)"
    return Profile(
        identity=identity,
        uids=uids,
        launcher_uid=int(hello["uid"]),
        landlock_abi=abi,
        seccomp=seccomp,
        namespaces=spaces,
        reaper="subreaper",
        runnable=reason is None,
        reason=reason,
    )


def forbidden_uids(hello: dict[str, Any]) -> tuple[int, ...]:
    """Uids the skills' range must not contain besides root and skilld's: the launcher's."""
    return (int(hello["uid"]),)
