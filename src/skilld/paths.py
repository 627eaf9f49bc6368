"""Where skilld's files are: the cache and state directories, the ABI and the skill SDK.

Imports nothing of skilld's but its errors, and nothing heavy: ``skilld serve`` needs
the cache's location before it has imported the runtime, and the build needs it too.

skilld's own files are private (:func:`private_dir`, :func:`private_file`): its state
directory 0700, its database, audit log and keys 0600; a wider mode found at start is
narrowed and said. A secret the operator gives it (a signing key, a token file, a
request-state key) is read with :func:`read_private`, which refuses one others may read.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """``$SKILLD_CACHE``, else ``~/.cache/skilld``: built components and native code."""
    return Path(os.environ.get("SKILLD_CACHE") or Path.home() / ".cache" / "skilld")


def state_dir(name: str) -> Path:
    """Where ``name``'s key-value state and audit log live unless ``--state-dir`` says.

    ``$SKILLD_STATE_DIR`` as it is (one place an operator chose, as the image does); else
    ``$XDG_STATE_HOME/skilld/NAME``, else ``~/.local/state/skilld/NAME``. ``name`` keeps
    apart what must not share notes: each served bundle (:func:`bundle_state_name`) and
    ``skilld call``.
    """
    if env := os.environ.get("SKILLD_STATE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "skilld" / name


_log = logging.getLogger("skilld.paths")
WORK_DIR_ENV = "SKILLD_WORK_DIR"
# Per-call directories inside the work directory carry their server's pid after this
# prefix, so that a start sweeps only what a dead process left.
_SCRATCH = ("ws-", "copies-", "kept-")
# Where root's scratch goes when its state directory is out of other uids' reach.
SHARED_WORK = Path("/var/lib/skilld-work")
_MNT_DETACH = 2


def work_dir(state: Path) -> Path:
    """Where per-call scratch goes (Agent Skill workspaces, the copies of a skill's files).

    ``$SKILLD_WORK_DIR`` when set (an operator's choice: a tmpfs, a faster disk), else
    ``STATE/work``: in the image, the state volume's ``/var/lib/skilld/work``. Never an
    implicit ``/tmp`` (absent or read-only in a container) nor ``$TMPDIR`` (inherited from
    whatever started skilld, often the shared ``/tmp``).
    """
    if env := os.environ.get(WORK_DIR_ENV):
        return Path(env)
    return Path(state) / "work"


def make_work_dir(state: Path, *, audit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """Create :func:`work_dir` once at node start (mode 0711), and sweep what a dead
    server left there (:func:`sweep_work_dir`); the directory. What the sweep cannot
    remove is logged and, given ``audit``, recorded there (``event: work-leftover``);
    it never stops the start.

    0711: the server lists it, a script running under another uid can reach its own
    per-call directory inside (made 0700 and handed to it) but cannot list the others'.
    As root, a work directory below a directory other users cannot pass (``~root`` is
    0700) is replaced by ``/var/lib/skilld-work/DIGEST`` (one per state directory):
    scripts run under uids of their own and must reach their workspace.

    Raises:
        OSError: it cannot be created, or it is a link or another user's directory.
    """
    # Absolute: the launcher enters it from a directory of its own, and a relative
    # ``--state-dir state`` named no directory there.
    work = work_dir(state).absolute()
    if os.geteuid() == 0 and not os.environ.get(WORK_DIR_ENV) and not _searchable(work):
        # Scripts run under a uid of their own, which must reach their workspace: a state
        # directory under a private home (root's ~/.local/state, 0700) is out of reach.
        # Its scratch goes to a directory of its own below /var/lib instead; the modes
        # of the operator's directories are never changed.
        digest = hashlib.sha256(os.fsencode(state.resolve())).hexdigest()[:16]
        work = SHARED_WORK / digest
        SHARED_WORK.mkdir(mode=0o711, parents=True, exist_ok=True)
    work.mkdir(mode=0o711, parents=True, exist_ok=True)
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise PermissionError(
                f"{work} belongs to uid {info.st_uid}, not to skilld (uid {os.geteuid()})"
            )
        os.fchmod(fd, 0o711)
    finally:
        os.close(fd)
    for name in sweep_work_dir(work):
        _log.warning(
            "could not remove %s, left by a server that is gone; remove it as root "
            "(rm -rf) when no server uses %s",
            work / name,
            work,
        )
        if audit is not None:
            audit({"event": "work-leftover", "path": str(work / name), "start": time.time()})
    return work


def sweep_work_dir(work: Path) -> list[str]:
    """Remove what dead servers left in ``work`` (their per-call directories and
    copies); the names it could not remove, for the caller to say and audit. Never
    raises: a leftover never stops a server from starting."""
    left: list[str] = []
    try:
        entries = [e.name for e in os.scandir(work)]
    except OSError:
        return left
    for name in entries:
        if name.startswith(_SCRATCH) and not _alive(name) and not remove_tree(work / name):
            left.append(name)
    return left


def _searchable(path: Path) -> bool:
    """Whether every existing directory above ``path`` lets other users through (``o+x``)."""
    for parent in path.absolute().parents:
        try:
            mode = parent.stat().st_mode
        except FileNotFoundError:
            continue  # made below with mode 0711
        if not mode & 0o001:
            return False
    return True


def scratch_prefix(kind: str, skill_id: str) -> str:
    """The name prefix of one per-call directory (``ws``) or copy (``copies``)."""
    return f"{kind}-{os.getpid()}-{skill_id}-"


def _alive(name: str) -> bool:
    pid = name.split("-")[1]
    if not pid.isdigit():
        return True  # not ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Step:
    """One step of :func:`walk_beneath`: an entry met (``left`` False), or a directory
    left after everything beneath it (``left`` True; only directories it entered).

    ``dir_fd`` is the open directory holding ``name`` (valid until the next step);
    ``parts`` that directory's names below the top; names are as ``os.fsdecode`` gives
    them (a name that is not UTF-8 holds surrogates)."""

    dir_fd: int
    parts: tuple[str, ...]
    name: str
    st: os.stat_result
    left: bool = False


def walk_beneath(top: int) -> Iterator[Step]:
    """Every entry beneath the open directory ``top``, pre-order and sorted, by
    descriptor and never through a link, to any depth.

    Directories are entered after their step is yielded (the consumer may make one
    searchable first) and left by their ``..``, checked to be the directory that was
    entered from: at most two descriptors besides ``top`` are open at once, whatever the
    depth, and nothing recurses (a tree a script made 10,000 levels deep is walked like a
    flat one). A directory that cannot be opened or listed is not entered.

    Raises:
        OSError: a directory's ``..`` is not the directory it was entered from (the tree
            was moved while walked).
    """
    # Each level: (identity, parts, names still to visit (reversed), name, st).
    levels: list[tuple[tuple[int, int], tuple[str, ...], list[str], str, os.stat_result]] = []
    here = os.fstat(top)
    levels.append(((here.st_dev, here.st_ino), (), _names(top) or [], "", here))
    fd = top
    try:
        while levels:
            _ident, parts, names, dname, dstat = levels[-1]
            if not names:
                levels.pop()
                if not levels:
                    break
                if len(levels) == 1:
                    up = top
                else:
                    up = os.open("..", _DIR_FLAGS, dir_fd=fd)
                    now = os.fstat(up)
                    if (now.st_dev, now.st_ino) != levels[-1][0]:
                        os.close(up)
                        raise OSError(f"{'/'.join(parts)} was moved while it was walked")
                os.close(fd)
                fd = up
                yield Step(fd, levels[-1][1], dname, dstat, left=True)
                continue
            name = names.pop()
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            yield Step(fd, parts, name, st)
            if not stat.S_ISDIR(st.st_mode):
                continue
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue
            now = os.fstat(sub)
            inner = _names(sub) if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) else None
            if inner is None:
                os.close(sub)
                continue
            if fd != top:
                os.close(fd)
            fd = sub
            levels.append(((now.st_dev, now.st_ino), (*parts, name), inner, name, now))
    finally:
        if fd != top:
            os.close(fd)


def _names(fd: int) -> list[str] | None:
    """The names in the open directory ``fd``, reverse-sorted (popped in order)."""
    try:
        return sorted(os.listdir(fd), reverse=True)
    except OSError:
        return None


def remove_tree(path: Path) -> bool:
    """Remove ``path``, best effort and to any depth (:func:`walk_beneath`): a tmpfs
    mounted on it is detached first, and the permissions a script took from its
    directories are given back; whether it is gone. Never raises."""
    if os.path.ismount(path):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.umount2(os.fsencode(path), _MNT_DETACH)
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(path).st_mode):  # never a link's target
            os.chmod(path, 0o700)  # noqa: PTH101 - the same call as below, by name
    try:
        top = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return True
    except OSError:
        with contextlib.suppress(OSError):
            path.unlink()  # a link or a file: never followed
        return not os.path.lexists(path)
    try:
        for step in walk_beneath(top):
            with contextlib.suppress(OSError):
                if step.left:
                    os.rmdir(step.name, dir_fd=step.dir_fd)
                elif stat.S_ISDIR(step.st.st_mode):
                    # A directory the script closed (mode 0) is opened again: its
                    # process tree is gone, nothing else writes there.
                    os.chmod(step.name, 0o700, dir_fd=step.dir_fd)
                else:
                    os.unlink(step.name, dir_fd=step.dir_fd)
    except OSError:
        pass  # moved while walked: what is left stays, reported below
    finally:
        os.close(top)
    with contextlib.suppress(OSError):
        path.rmdir()
    return not os.path.lexists(path)


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) skilld's private state directory; ``path``.

    Mode 0700; 0711 (others may pass, never list) when skilld is not root and its work
    directory is inside it, where scripts running under uids of their own must reach
    their workspace (as root the work directory moves out instead: ``make_work_dir``).
    An existing directory with a wider mode is narrowed, and said in the log; one of
    another user is left as it is, and said.

    Raises:
        OSError: it cannot be created or opened.
    """
    inside = not os.environ.get(WORK_DIR_ENV) and os.geteuid() != 0
    wanted = 0o711 if inside else 0o700
    path.mkdir(mode=wanted, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _narrow(fd, path, wanted, "state directory")
    finally:
        os.close(fd)
    return path


def private_file(fd: int, path: Path | str, what: str) -> None:
    """Narrow the open file ``fd`` (skilld's own ``what`` at ``path``) to mode 0600 when
    its group or others may use it, and say so in the log. Never raises."""
    with contextlib.suppress(OSError):
        _narrow(fd, path, 0o600, what)


def _narrow(fd: int, path: Path | str, wanted: int, what: str) -> None:
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if not mode & ~wanted & 0o077:
        return
    if st.st_uid != os.geteuid() and os.geteuid() != 0:
        _log.warning(
            "the %s %s has mode %04o and belongs to uid %d, not skilld's: make it %04o "
            "(chmod %o %s)",
            what, path, mode, st.st_uid, wanted, wanted, path,
        )  # fmt: skip
        return
    os.fchmod(fd, mode & wanted)
    _log.warning(
        "the %s %s had mode %04o, readable by others; narrowed to %04o",
        what, path, mode, mode & wanted,
    )  # fmt: skip


# What a key or token file may hold at most.
MAX_SECRET_FILE = 64 << 10


def read_private(path: Path, what: str) -> bytes:
    """The bytes of the operator's secret ``what`` at ``path`` (a key, a token file),
    which must be private: no permission for group or others.

    Raises:
        UsageError: it cannot be read, is larger than :data:`MAX_SECRET_FILE`, or its
            mode lets others read or write it (the message names the file and the
            ``chmod`` to run).
    """
    from skilld.errors import UsageError

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot read the {what}: {exc.strerror}", location=str(path)) from exc
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise UsageError(
                f"the {what} has mode {mode:04o}: other users may read or change it, so it "
                "is refused",
                location=str(path),
                hint=f"make it private: chmod 600 {path} (in Kubernetes, mount the "
                "secret with defaultMode: 0400)",
            )
        data = fh.read(MAX_SECRET_FILE + 1)
    if len(data) > MAX_SECRET_FILE:
        raise UsageError(f"the {what} is too large to be one", location=str(path))
    return data


def bundle_state_name(bundle: Path) -> str:
    """The default state's name for a bundle: its directory's name and a digest of its path.

    Keyed by where the bundle is, not by its content, so that a rebuilt bundle in the same
    place keeps its state, while two bundles never see each other's.
    """
    where = Path(bundle).resolve()
    return f"{where.name}-{hashlib.sha256(str(where).encode()).hexdigest()[:12]}"


def wit_dir() -> Path:
    """The directory holding the skill ABI (``skilld:skill``) shipped with skilld."""
    return Path(__file__).resolve().parent / "wit"


def runner_dir() -> Path:
    """The CPython runner component's sources (``sandbox/pyrunner``: a skill built once)."""
    return Path(__file__).resolve().parent / "sandbox" / "pyrunner"


def sdk_dir() -> Path:
    """The ``skilld_sdk`` package copied into every Python skill (found, not imported)."""
    spec = importlib.util.find_spec("skilld_sdk")
    if spec is None or spec.origin is None:  # pragma: no cover - it ships with skilld
        raise ModuleNotFoundError("skilld_sdk is not installed beside skilld")
    return Path(spec.origin).resolve().parent
