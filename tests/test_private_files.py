"""skilld's files are private (issue 27 item 5, issue 28 item 2).

Its own files (state directory, state database, audit log) are made private, and a
wider mode found at start is narrowed and said in the log; every secret the operator
gives it (a signing or cluster key, a token file, a request-state key, a NATS secret)
is refused when others may read it, naming the file and the chmod to run.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from skilld import paths
from skilld.audit import JsonLinesSink
from skilld.errors import UsageError
from skilld.mcp._auth import parse_token_file
from skilld.package import SigningKey, load_private_key, write_private_key
from skilld.state import SqliteState


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_state_directory_database_and_audit_log_are_private(tmp_path: Path) -> None:
    """Made fresh (under a permissive umask, the control): 0700, 0600, 0600."""
    old = os.umask(0o000)
    try:
        state = paths.private_dir(tmp_path / "state")
        SqliteState(state / "state.sqlite3").close()
        JsonLinesSink(state / "audit.jsonl").close()
        (state / "other").write_text("x")  # the control: the umask lets others in
    finally:
        os.umask(old)
    assert _mode(state / "other") == 0o666
    assert _mode(state) == (0o711 if os.geteuid() != 0 else 0o700)
    assert _mode(state / "state.sqlite3") == 0o600
    assert _mode(state / "audit.jsonl") == 0o600


def test_wider_modes_found_at_start_are_narrowed_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A state directory 0755 and a database, its WAL and an audit log 0644 (what an
    older skilld left): narrowed at start, each named in a warning."""
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    SqliteState(state / "state.sqlite3").close()
    JsonLinesSink(state / "audit.jsonl").close()
    for name in ("state.sqlite3", "audit.jsonl"):
        (state / name).chmod(0o644)
    (state / "state.sqlite3-wal").write_bytes(b"")
    (state / "state.sqlite3-wal").chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="skilld.paths"):
        paths.private_dir(state)
        SqliteState(state / "state.sqlite3").close()
        JsonLinesSink(state / "audit.jsonl").close()
    assert _mode(state) & 0o077 in (0, 0o011)
    for name in ("state.sqlite3", "audit.jsonl"):
        assert _mode(state / name) == 0o600, name
        assert any(name in r.getMessage() and "narrowed" in r.getMessage() for r in caplog.records)
    if (state / "state.sqlite3-wal").exists():
        assert _mode(state / "state.sqlite3-wal") == 0o600
    assert any("state directory" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o660])
def test_a_secret_others_may_use_is_refused(tmp_path: Path, mode: int) -> None:
    """A token file, a private key and a request-state key with any permission for group
    or others: refused, naming the file and the chmod to run; 0600 and 0400 are read
    (the control)."""
    tokens = tmp_path / "tokens"
    tokens.write_text("alice a-token-of-some-length-0123456789abcdef\n")
    key = tmp_path / "signing.pem"
    write_private_key(SigningKey.generate(), key)
    secret = tmp_path / "request-state.key"
    secret.write_text("ab" * 32)
    for path in (tokens, key, secret):
        path.chmod(mode)
    checks = [
        lambda: parse_token_file(tokens),
        lambda: load_private_key(key),
        lambda: paths.read_private(secret, "request-state key"),
    ]
    for path, check in zip((tokens, key, secret), checks, strict=True):
        with pytest.raises(UsageError) as err:
            check()
        text = str(err.value)
        assert str(path) in text and f"chmod 600 {path}" in text, text
        for private in (0o600, 0o400):
            path.chmod(private)
            check()
        path.chmod(mode)


def test_a_nats_secret_others_may_read_is_refused(tmp_path: Path) -> None:
    """The NATS nkey seed, creds and user files are secrets too."""
    from skilld.cluster._link import _read_secret

    seed = tmp_path / "node.nk"
    seed.write_text("SUAEXAMPLE\n")
    seed.chmod(0o644)
    with pytest.raises(UsageError, match="chmod 600"):
        _read_secret(seed, "NATS nkey seed file")
    seed.chmod(0o600)
    assert _read_secret(seed, "NATS nkey seed file") == "SUAEXAMPLE"
