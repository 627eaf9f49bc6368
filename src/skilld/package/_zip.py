"""The canonical ZIP subset that ``.skill`` packages use, written and read strictly.

A package is a plain ZIP archive that any unzip tool opens, restricted to one
canonical form so that the same files always give the same bytes and so that no
byte of a package can change unnoticed:

* entries stored (method 0), sorted by name, each a regular file with mode 0644;
* one timestamp for every entry (from ``SOURCE_DATE_EPOCH``, clamped to 1980);
* no extra fields, comments, data descriptors, encryption, ZIP64, directories,
  or bytes before the first entry or after the end record.

The reader parses leniently enough to say *why* an archive is refused (an
absolute or ``..`` name, a duplicate, a link or device, a size over a limit, a
compressed entry) and then requires every header to equal, byte for byte, the
header the writer would have produced. Because entries are stored, declared and
actual sizes are the same number and no entry can expand: a "zip bomb" is
refused by its declared size before any of its bytes is touched.
"""

from __future__ import annotations

import re
import stat
import struct
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from skilld.errors import PackageFormatError

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_END = struct.Struct("<IHHHHIIH")
_LOCAL_SIG = 0x04034B50
_CENTRAL_SIG = 0x02014B50
_END_SIG = 0x06054B50
_VERSION = 20  # "2.0": the oldest version that knows stored files in directories
_MADE_BY = (3 << 8) | _VERSION  # made on Unix, so the external attributes carry a mode
_MODE = stat.S_IFREG | 0o644
_ATTR = _MODE << 16
_DOS_EPOCH = 315532800  # 1980-01-01T00:00:00Z, the earliest time a ZIP header can carry
_DOS_LAST = 4354819199  # 2107-12-31T23:59:59Z, the latest
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")  # fullmatch: "$" allows a final "\n"
MAX_NAME = 255


@dataclass(frozen=True, slots=True)
class ZipEntry:
    """One stored entry: its name, its bytes (a view into the archive) and declared CRC-32."""

    name: str
    data: memoryview
    crc: int


@dataclass(frozen=True, slots=True)
class ZipArchive:
    """The entries of a canonical archive, sorted by name, and their shared DOS timestamp."""

    entries: tuple[ZipEntry, ...]
    dos_time: int
    dos_date: int


def dos_datetime(epoch: int) -> tuple[int, int]:
    """The (time, date) header fields for ``epoch`` seconds (UTC), clamped to what ZIP holds."""
    t = time.gmtime(min(max(epoch, _DOS_EPOCH), _DOS_LAST))
    return (
        (t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec // 2),
        ((t.tm_year - 1980) << 9) | (t.tm_mon << 5) | t.tm_mday,
    )


def check_name(name: str) -> None:
    """Refuse an entry name that is not a plain relative path of safe segments.

    Raises:
        PackageFormatError: absolute, holds ``..`` or ``.``, a backslash, an empty
            segment, a character outside ``[A-Za-z0-9._-]``, or too long.
    """
    if not name:
        raise PackageFormatError("archive entry with an empty name")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise PackageFormatError(f"archive entry {name!r} has an absolute path")
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise PackageFormatError(f"archive entry {name!r} contains '..'")
    if name.endswith("/"):
        raise PackageFormatError(f"archive entry {name!r} is a directory, not a regular file")
    if "\\" in name:
        raise PackageFormatError(f"archive entry {name!r} contains a backslash")
    if len(name) > MAX_NAME:
        raise PackageFormatError(f"archive entry name is longer than {MAX_NAME} characters")
    for part in parts:
        if not _SEGMENT.fullmatch(part):
            raise PackageFormatError(
                f"archive entry {name!r} has a segment {part!r} outside [A-Za-z0-9._-] "
                "(or empty, or starting with '.' or '-')"
            )


def _local_header(name: bytes, crc: int, size: int, dos_time: int, dos_date: int) -> bytes:
    return (
        _LOCAL.pack(_LOCAL_SIG, _VERSION, 0, 0, dos_time, dos_date, crc, size, size, len(name), 0)
        + name
    )


def _central_header(
    name: bytes, crc: int, size: int, dos_time: int, dos_date: int, offset: int
) -> bytes:
    return _CENTRAL.pack(
        _CENTRAL_SIG, _MADE_BY, _VERSION, 0, 0, dos_time, dos_date, crc, size, size,
        len(name), 0, 0, 0, 0, _ATTR, offset,
    ) + name  # fmt: skip


def write_zip(files: Sequence[tuple[str, bytes | memoryview]], *, dos: tuple[int, int]) -> bytes:
    """The canonical archive holding ``files`` (name, bytes), timestamped ``dos`` (time, date).

    Raises:
        PackageFormatError: a name is unsafe or repeated, or a file is over 4 GiB.
    """
    dos_time, dos_date = dos
    chunks: list[bytes | memoryview] = []
    central: list[bytes] = []
    offset = 0
    seen: set[str] = set()
    for name, data in sorted(files, key=lambda f: f[0]):
        check_name(name)
        if name in seen:
            raise PackageFormatError(f"archive entry {name!r} appears twice")
        seen.add(name)
        if len(data) >= 1 << 32:
            raise PackageFormatError(f"{name} is too large for a package (4 GiB or more)")
        raw = name.encode("ascii")
        crc = zlib.crc32(data)
        central.append(_central_header(raw, crc, len(data), dos_time, dos_date, offset))
        header = _local_header(raw, crc, len(data), dos_time, dos_date)
        chunks += [header, data]
        offset += len(header) + len(data)
    cd = b"".join(central)
    end = _END.pack(_END_SIG, 0, 0, len(central), len(central), len(cd), offset, 0)
    return b"".join([*chunks, cd, end])


@dataclass(frozen=True, slots=True)
class _Central:
    name: str
    raw_name: bytes
    made_by: int
    flags: int
    method: int
    dos_time: int
    dos_date: int
    crc: int
    csize: int
    usize: int
    attr: int
    offset: int
    header: bytes


def _parse_central(view: memoryview, start: int, end: int, count: int) -> list[_Central]:
    out = []
    pos = start
    for _ in range(count):
        if pos + _CENTRAL.size > end:
            raise PackageFormatError("central directory is truncated")
        fields = _CENTRAL.unpack_from(view, pos)
        (sig, made_by, _need, flags, method, dtime, ddate, crc, csize, usize, nlen, xlen, clen,
         _disk, _iattr, attr, offset) = fields  # fmt: skip
        if sig != _CENTRAL_SIG:
            raise PackageFormatError(f"bad central directory record at offset {pos}")
        stop = pos + _CENTRAL.size + nlen + xlen + clen
        if stop > end:
            raise PackageFormatError("central directory is truncated")
        raw = bytes(view[pos + _CENTRAL.size : pos + _CENTRAL.size + nlen])
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PackageFormatError(f"archive entry name {raw!r} is not UTF-8") from exc
        header = bytes(view[pos:stop])
        out.append(
            _Central(
                name,
                raw,
                made_by,
                flags,
                method,
                dtime,
                ddate,
                crc,
                csize,
                usize,
                attr,
                offset,
                header,
            )
        )
        pos = stop
    if pos != end:
        raise PackageFormatError("central directory size does not match its records")
    return out


def _check_kind(c: _Central) -> None:
    if c.made_by >> 8 == 3:  # Unix: the high 16 bits of the attributes are st_mode
        mode = c.attr >> 16
        if stat.S_ISLNK(mode):
            raise PackageFormatError(f"archive entry {c.name!r} is a symbolic link")
        if stat.S_ISDIR(mode):
            raise PackageFormatError(f"archive entry {c.name!r} is a directory")
        if stat.S_IFMT(mode) not in (0, stat.S_IFREG):
            raise PackageFormatError(
                f"archive entry {c.name!r} is not a regular file (a device, FIFO or socket)"
            )
    elif c.attr & 0x10:  # MS-DOS directory bit
        raise PackageFormatError(f"archive entry {c.name!r} is a directory")


def read_zip(
    data: bytes, *, max_entries: int, max_file_bytes: int, max_total_bytes: int
) -> ZipArchive:
    """Parse a canonical archive, refusing anything the writer would not have produced.

    Raises:
        PackageFormatError: names the first problem found: truncation or trailing
            bytes, too many entries, an unsafe or repeated name, a link, directory
            or device, a compressed or encrypted entry, a size over a limit, or a
            header that differs from the canonical one.
    """
    view = memoryview(data)
    size = len(data)
    if size < _END.size:
        raise PackageFormatError(f"too short to be a package ({size} bytes)")
    end_at = size - _END.size
    sig, disk, cd_disk, n_disk, n_total, cd_size, cd_offset, comment = _END.unpack_from(
        view, end_at
    )
    if sig != _END_SIG:
        raise PackageFormatError(
            "no end-of-archive record at the end of the file (truncated, trailing bytes, "
            "or an archive comment)"
        )
    if disk or cd_disk or n_disk != n_total or comment:
        raise PackageFormatError("end-of-archive record is not canonical (multi-disk or comment)")
    if n_total > max_entries:
        raise PackageFormatError(f"archive has {n_total} entries, over the limit of {max_entries}")
    if cd_offset + cd_size != end_at:
        raise PackageFormatError("central directory is not where the end record says it is")
    centrals = _parse_central(view, cd_offset, end_at, n_total)

    seen: set[str] = set()
    folded: dict[str, str] = {}
    total = 0
    for c in centrals:
        check_name(c.name)
        if c.name in seen:
            raise PackageFormatError(f"archive entry {c.name!r} appears twice")
        # Names that differ only in case would overwrite each other when unpacked on a
        # case-insensitive file system (macOS, Windows).
        if c.name.lower() in folded:
            raise PackageFormatError(
                f"archive entries {folded[c.name.lower()]!r} and {c.name!r} differ only in case"
            )
        seen.add(c.name)
        folded[c.name.lower()] = c.name
        _check_kind(c)
        # Declared sizes first: a bomb is refused before any of its bytes is looked at.
        if c.usize > max_file_bytes or c.csize > max_file_bytes:
            raise PackageFormatError(
                f"archive entry {c.name!r} declares {max(c.usize, c.csize)} bytes, "
                f"over the per-file limit of {max_file_bytes}"
            )
        total += c.usize
        if total > max_total_bytes:
            raise PackageFormatError(
                f"archive expands to more than the total limit of {max_total_bytes} bytes"
            )
        if c.flags & 0x1:
            raise PackageFormatError(f"archive entry {c.name!r} is encrypted")
        if c.method != 0:
            raise PackageFormatError(
                f"archive entry {c.name!r} is compressed (method {c.method}); "
                "package entries are stored uncompressed"
            )
        if c.csize != c.usize:
            raise PackageFormatError(
                f"archive entry {c.name!r} declares {c.csize} stored bytes but {c.usize} "
                "expanded bytes"
            )

    names = [c.name for c in centrals]
    if names != sorted(names):
        raise PackageFormatError("archive entries are not sorted by name")
    if not centrals:
        raise PackageFormatError("archive is empty")
    dos_time, dos_date = centrals[0].dos_time, centrals[0].dos_date
    entries = []
    pos = 0
    for c in centrals:
        if c.header != _central_header(c.raw_name, c.crc, c.usize, dos_time, dos_date, pos):
            raise PackageFormatError(
                f"central directory record of {c.name!r} is not canonical "
                "(offset, timestamp, mode, flags, extra field or comment)"
            )
        local = _local_header(c.raw_name, c.crc, c.usize, dos_time, dos_date)
        data_at = pos + len(local)
        if data_at + c.usize > cd_offset or view[pos:data_at] != local:
            raise PackageFormatError(
                f"local header of {c.name!r} does not match its central directory record"
            )
        entries.append(ZipEntry(c.name, view[data_at : data_at + c.usize], c.crc))
        pos = data_at + c.usize
    if pos != cd_offset:
        raise PackageFormatError("archive holds bytes outside its entries")
    return ZipArchive(tuple(entries), dos_time, dos_date)


def check_crc(entry: ZipEntry) -> None:
    """Refuse an entry whose bytes do not match its header's CRC-32.

    Raises:
        PackageFormatError: the CRC-32 differs.
    """
    if zlib.crc32(entry.data) != entry.crc:
        raise PackageFormatError(f"CRC-32 of archive entry {entry.name!r} does not match")
