"""Compiled native code: compile once, cache on disk, load only verified bytes.

Deserializing native code runs whatever it says, so it is only safe for bytes
whose digest we checked. The cache file is opened once, hashed through that
file descriptor, and handed to wasmtime as ``/proc/self/fd/N``: the bytes that
were hashed are the bytes that load (the inode cannot be swapped in between).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from pathlib import Path

import wasmtime
from wasmtime import component

from skilld.digest import open_regular, sha256_fd
from skilld.errors import CompileError, DigestMismatch
from skilld.sandbox._engine import Engine

_CHUNK = 1 << 20


def compile_component(engine: Engine, wasm: bytes, *, name: str) -> component.Component:
    """JIT-compile component bytes.

    Raises:
        CompileError: the bytes are not a valid component for this engine.
    """
    try:
        return component.Component(engine.wasmtime, wasm)
    except wasmtime.WasmtimeError as exc:
        raise CompileError(
            f"{name}: not a valid WebAssembly component: {_first_line(exc)}"
        ) from exc


def load_native(
    engine: Engine, path: Path, expected_sha256: str, *, opened: tuple[int, str] | None = None
) -> component.Component:
    """Load native code from ``path`` after checking its sha256.

    Args:
        opened: a descriptor of ``path`` and the sha256 of what it reads, hashed ahead
            (see :class:`skilld.digest.Prehash`); the code loads through that descriptor.
            The caller keeps ownership of it.

    Raises:
        DigestMismatch: the file's bytes are not the expected ones.
        CompileError: wasmtime refused the bytes (another engine build, corrupt).
    """
    fd = open_regular(path) if opened is None else opened[0]
    try:
        actual = sha256_fd(fd) if opened is None else opened[1]
        if actual != expected_sha256:
            raise DigestMismatch(
                f"native code digest is {actual[:16]}…, expected {expected_sha256[:16]}…",
                location=str(path),
            )
        try:
            return component.Component.deserialize_file(engine.wasmtime, f"/proc/self/fd/{fd}")
        except wasmtime.WasmtimeError as exc:
            raise CompileError(
                f"native code does not load: {_first_line(exc)}", location=str(path)
            ) from exc
    finally:
        if opened is None:
            os.close(fd)


def write_native(comp: component.Component, path: Path) -> str:
    """Serialize ``comp`` to ``path`` atomically; returns the file's sha256."""
    data = bytes(comp.serialize())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".native-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return hashlib.sha256(data).hexdigest()


class NativeCache:
    """Native code on disk, keyed by the component's sha256 and the engine fingerprint.

    Each entry has a sidecar holding the native file's sha256, checked before
    loading. Whoever can write the directory could plant code, or rename another
    directory into its place, so every level from ``root`` down must be owned by
    this user and writable by no one else; the levels it creates are 0700.

    Raises:
        CompileError: a directory of the cache is not private to this user.
    """

    def __init__(self, engine: Engine, root: Path):
        self.engine = engine
        self.root = _private_dir(Path(root), "native", engine.fingerprint)

    def load(self, wasm: bytes, *, name: str) -> component.Component:
        """The compiled component for ``wasm``: from the cache, or compiled and cached.

        Raises:
            CompileError: the component does not compile.
        """
        key = hashlib.sha256(wasm).hexdigest()
        native = self.root / f"{key}.cwasm"
        sidecar = self.root / f"{key}.sha256"
        if native.is_file() and sidecar.is_file():
            try:
                return load_native(self.engine, native, sidecar.read_text().strip())
            except (DigestMismatch, CompileError):
                pass  # a damaged entry is rebuilt below, never loaded
        comp = compile_component(self.engine, wasm, name=name)
        digest = write_native(comp, native)
        sidecar.write_text(digest + "\n")
        return comp


def _private_dir(root: Path, *parts: str) -> Path:
    """``root/parts...``, creating missing levels 0700 and checking every level is private.

    Raises:
        CompileError: a level is not a directory, not this user's, or group/other-writable.
    """
    # Only the root's own parents are created with the umask: they are above the cache.
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = root
    _check_private(path)
    for part in parts:
        path = path / part
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        _check_private(path)
    return path


def _check_private(path: Path) -> None:
    st = path.stat()
    problem = None
    if not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not by this user ({os.geteuid()})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = "is writable by group or others"
    if problem is not None:
        raise CompileError(
            f"native-code cache directory {problem}; refusing to load code from it",
            location=str(path),
            hint=f"make it yours and private (chmod 700 {path}), or point SKILLD_CACHE elsewhere",
        )


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
