"""Where skilld's files are: the cache and state directories, the ABI and the skill SDK.

Imports nothing of skilld's and nothing heavy: ``skilld serve`` needs the cache's
location before it has imported the runtime, and the build needs it too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path


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


WORK_DIR_ENV = "SKILLD_WORK_DIR"
# Per-call directories inside the work directory carry their server's pid after this
# prefix, so that a start sweeps only what a dead process left.
_SCRATCH = ("ws-", "copies-")
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


def make_work_dir(state: Path) -> Path:
    """Create :func:`work_dir` once at node start (mode 0711), and sweep what a dead
    server left there; the directory.

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
    for entry in os.scandir(work):
        if entry.name.startswith(_SCRATCH) and not _alive(entry.name):
            remove_tree(Path(entry.path))
    return work


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


def remove_tree(path: Path) -> None:
    """Remove ``path`` (best effort): a tmpfs mounted on it is detached first, and the
    write permission a script took from its directories is given back."""
    import shutil

    if os.path.ismount(path):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.umount2(os.fsencode(path), _MNT_DETACH)

    for dirpath, dirs, _names in os.walk(path):
        for d in dirs:
            sub = Path(dirpath) / d
            if not sub.is_symlink():
                sub.chmod(0o700)
    shutil.rmtree(path, ignore_errors=True)


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
