"""Helpers for package tests: signed archives with any manifest, hostile hand-made ZIPs."""

from __future__ import annotations

import stat
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skilld.package import SigningKey, SkillMeta, canonical_json
from skilld.package._pack import signature_entry
from skilld.package._zip import dos_datetime, write_zip

META = SkillMeta("notes", "Notes", "1.2.3", "Keeps notes.", {"kv": {}, "fs": {"read": ["/data"]}})
COMPONENT = b"\x00asm\x01\x00\x00\x00 not really a component, but bytes are bytes"


def signed_archive(
    manifest: Mapping[str, Any] | bytes,
    files: Mapping[str, bytes],
    keys: Sequence[SigningKey],
) -> bytes:
    """A canonical archive with this exact manifest (dict or raw bytes), files and signatures."""
    raw = manifest if isinstance(manifest, bytes) else canonical_json(manifest)
    entries: list[tuple[str, bytes | memoryview]] = [("skill.json", raw), *files.items()]
    entries += [signature_entry(k, raw) for k in keys]
    return write_zip(entries, dos=dos_datetime(0))


@dataclass
class RawEntry:
    """One entry of a hand-made (possibly hostile) ZIP archive."""

    name: str
    data: bytes = b"x"
    method: int = 0
    mode: int = stat.S_IFREG | 0o644
    usize: int | None = None
    extra: bytes = b""


def raw_zip(entries: Sequence[RawEntry]) -> bytes:
    """A ZIP archive written field by field, so tests can put anything in it."""
    t, d = dos_datetime(0)
    body, central = b"", b""
    for e in entries:
        name = e.name.encode()
        crc = zlib.crc32(e.data)
        usize = len(e.data) if e.usize is None else e.usize
        head = struct.pack(
            "<IHHHHHIIIHH", 0x04034B50, 20, 0, e.method, t, d, crc, len(e.data), usize,
            len(name), len(e.extra),
        )  # fmt: skip
        central += struct.pack(
            "<IHHHHHHIIIHHHHHII", 0x02014B50, (3 << 8) | 20, 20, 0, e.method, t, d, crc,
            len(e.data), usize, len(name), len(e.extra), 0, 0, 0, e.mode << 16, len(body),
        ) + name + e.extra  # fmt: skip
        body += head + name + e.extra + e.data
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central),
                      len(body), 0)  # fmt: skip
    return body + central + end
