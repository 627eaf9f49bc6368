"""Verifying an 18 MB package against hashing its bytes once.

Builds a package with an 18 MB random component (about the size of a Python
skill), signs it with an ephemeral key, then times ``verify_package`` from bytes
and from a file beside one sha256 of the same bytes. Verification hashes every
byte twice (the package digest and each file's digest) and checks CRC-32s, so
the target is a small multiple of the raw hash and well under 100 ms.

Run: ``python bench/bench_verify.py``
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import row, timings

from skilld.package import (
    SigningKey,
    SkillMeta,
    TrustStore,
    build_package,
    trusted_key,
    verify_package,
)

SIZE = 18 * 1024 * 1024
RUNS = 15


def main() -> None:
    """Print the timings as a Markdown table and the ratio to one sha256."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a few iterations: that it runs (CI; no targets)"
    )
    runs = 2 if parser.parse_args().quick else RUNS
    key = SigningKey.generate()
    trust = TrustStore((trusted_key("bench", key.public_raw, ["bench"]),))
    meta = SkillMeta("bench", "Bench", "1.0.0", "benchmark", {"kv": {}})
    data = build_package(meta, os.urandom(SIZE), files={"SKILL.md": b"# bench\n"}, keys=[key])
    print(f"package: {len(data) / 1e6:.1f} MB, {runs} runs, python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.skill"
        path.write_bytes(data)
        sha = timings(lambda: hashlib.sha256(data).digest(), n=runs)
        from_bytes = timings(lambda: verify_package(data, trust), n=runs)
        from_file = timings(lambda: verify_package(path, trust), n=runs)
    print("\n| step | median ms | p99 ms |\n|---|---|---|")
    print(row("sha256 of the package bytes (raw)", sha))
    print(row("verify_package(bytes)", from_bytes))
    print(row("verify_package(path), page cache warm", from_file))
    base = statistics.median(sha)
    print(f"\nratio verify(bytes) / sha256: {statistics.median(from_bytes) / base:.1f}x")
    print(f"ratio verify(path) / sha256:  {statistics.median(from_file) / base:.1f}x")


if __name__ == "__main__":
    main()
