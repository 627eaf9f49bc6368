"""``skilld keygen|pack|sign|verify|inspect``: make keys, write, sign and check ``.skill`` packages.

The package library is imported inside the handlers so that ``skilld --help``
does not load ``cryptography``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skilld.errors import UsageError

if TYPE_CHECKING:
    from skilld.package import SigningKey

_FORMAT_DOC = "docs/package-format.md"


def _add_passphrase(p: argparse.ArgumentParser, what: str) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--passphrase-env",
        metavar="VAR",
        help=f"read the passphrase {what} from environment variable VAR (never from argv)",
    )
    group.add_argument(
        "--passphrase-file",
        type=Path,
        metavar="FILE",
        help=f"read the passphrase {what} from FILE (one trailing newline is dropped)",
    )


def register(sub: Any) -> None:
    """Add ``skilld keygen``, ``pack``, ``sign``, ``verify`` and ``inspect``."""
    keygen = sub.add_parser(
        "keygen",
        help="create an Ed25519 signing key (and optionally its trust file)",
        description="Write a new Ed25519 private key (PKCS#8 PEM, mode 0600) and print its "
        "public key and key id. With --trust-out, also write the NAME.pub.json trust file "
        "that lets an appliance accept the key's signatures for the skills in --scope.",
        epilog="example: skilld keygen -o release.key --passphrase-env KEY_PASS "
        "--trust-out policies/trust/release.pub.json --scope 'acme-*'",
    )
    keygen.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        metavar="KEY",
        help="where to write the private key (refuses to overwrite)",
    )
    _add_passphrase(keygen, "that encrypts the key")
    keygen.add_argument("--force", action="store_true", help="overwrite an existing KEY")
    keygen.add_argument(
        "--trust-out",
        type=Path,
        metavar="FILE",
        help="also write the public key as a trust file (NAME.pub.json)",
    )
    keygen.add_argument("--name", help="key name in the trust file (default: KEY's file stem)")
    keygen.add_argument(
        "--scope",
        action="append",
        default=[],
        metavar="PATTERN",
        help="skill ids the key may sign, '*' matches any run of id characters "
        "(repeatable; required with --trust-out)",
    )
    keygen.add_argument(
        "--cluster",
        action="append",
        default=[],
        metavar="PATTERN",
        help="node names whose cluster announcements the key may sign (skilld serve "
        "--cluster-key; repeatable); with it, --scope may be left out",
    )
    keygen.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="PATTERN=N",
        help="require N distinct trusted keys for skill ids matching PATTERN (repeatable)",
    )
    keygen.set_defaults(handler=run_keygen)

    pack = sub.add_parser(
        "pack",
        help="pack a skill directory into a signed .skill package",
        description="Build DIR (skill.yaml + sources) into component.wasm, or take --component, "
        "and write a deterministic .skill package: skill.json (id, version, needs and the "
        "sha256 of every file), component.wasm, SKILL.md and resources/ when present, and one "
        "signature per key. The same inputs and SOURCE_DATE_EPOCH give the same bytes. "
        f"Format: {_FORMAT_DOC}.",
    )
    pack.add_argument(
        "dir",
        type=Path,
        metavar="DIR",
        help="the skill source directory (skill.yaml, or an Agent Skill's SKILL.md)",
    )
    pack.add_argument(
        "-o", "--output", type=Path, required=True, metavar="OUT.skill", help="the package to write"
    )
    pack.add_argument(
        "--key",
        type=Path,
        action="append",
        default=[],
        metavar="KEY",
        help="sign with this private key (repeatable)",
    )
    _add_passphrase(pack, "of the keys")
    pack.add_argument(
        "--ephemeral-key-out",
        type=Path,
        metavar="DIR",
        help="sign with a throwaway key DIR/<id>.key (made if absent, reused if present) "
        "and write a trust file DIR/<id>.pub.json scoped to this skill (for samples, CI, "
        "tests; never commit DIR)",
    )
    pack.add_argument(
        "--component",
        type=Path,
        metavar="FILE.wasm",
        help="pack this component instead of building DIR",
    )
    pack.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="build cache (default: $SKILLD_CACHE or ~/.cache/skilld)",
    )
    pack.set_defaults(handler=run_pack)

    sign = sub.add_parser(
        "sign",
        help="add a signature to a .skill package, in place",
        description="Check PKG's format and digests, then add KEY's signature over its manifest "
        "and replace the file atomically. Existing signatures are kept; signing twice with "
        "the same key changes nothing. Use it to collect the signatures a threshold needs.",
    )
    sign.add_argument(
        "package", type=Path, metavar="PKG", help="the .skill package, signed in place"
    )
    sign.add_argument(
        "--key", type=Path, required=True, metavar="KEY", help="the private key (skilld keygen)"
    )
    _add_passphrase(sign, "of the key")
    sign.set_defaults(handler=run_sign)

    verify = sub.add_parser(
        "verify",
        help="verify a .skill package against a trust directory",
        description="Check everything skilld checks before running a skill: the archive's "
        "form and limits, the manifest, every file's sha256, every signature, and that "
        "enough trusted keys whose scope covers the skill id signed it. Exits 0 only when "
        "the package is valid; otherwise prints why and exits 1.",
    )
    verify.add_argument("package", type=Path, metavar="PKG", help="the .skill package")
    verify.add_argument(
        "--trust",
        type=Path,
        required=True,
        metavar="DIR",
        help="the trust directory (NAME.pub.json files), e.g. policies/trust",
    )
    verify.add_argument("--expect-id", metavar="ID", help="refuse a package of another skill")
    verify.add_argument("--expect-version", metavar="V", help="refuse any other version")
    verify.add_argument("--json", action="store_true", help="print the result as JSON")
    verify.set_defaults(handler=run_verify)

    inspect = sub.add_parser(
        "inspect",
        help="show a .skill package's manifest, files, needs and signers",
        description="Print what a package declares: id, version, ABI, the needs it asks the "
        "policy for, every file with its sha256 and size, and the key ids that signed it. "
        "Format and digests are checked; signatures are NOT (use 'skilld verify').",
    )
    inspect.add_argument("package", type=Path, metavar="PKG", help="the .skill package")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of text")
    inspect.set_defaults(handler=run_inspect)


def _passphrase(args: argparse.Namespace) -> bytes | None:
    if args.passphrase_env:
        value = os.environ.get(args.passphrase_env)
        if not value:
            raise UsageError(f"environment variable {args.passphrase_env} is unset or empty")
        return value.encode("utf-8")
    if args.passphrase_file:
        path: Path = args.passphrase_file
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
        raw = raw.removesuffix(b"\n").removesuffix(b"\r")
        if not raw:
            raise UsageError(f"{path} holds an empty passphrase")
        return raw
    return None


def _thresholds(specs: list[str]) -> dict[str, int]:
    out = {}
    for spec in specs:
        pattern, sep, count = spec.rpartition("=")
        if not sep or not pattern or not count.isdigit():
            raise UsageError(f"--threshold {spec!r} must be PATTERN=N, e.g. 'acme-*=2'")
        out[pattern] = int(count)
    return out


def run_keygen(args: argparse.Namespace) -> int:
    """Handle ``skilld keygen``.

    Raises:
        UsageError: conflicting options, an unreadable passphrase, or KEY exists.
        TrustError: a bad --name, --scope or --threshold for the trust file.
    """
    from skilld.package import (
        SigningKey,
        trust_file_bytes,
        trusted_key,
        write_atomic,
        write_private_key,
    )

    if (args.scope or args.threshold or args.name or args.cluster) and not args.trust_out:
        raise UsageError("--scope, --cluster, --threshold and --name only apply with --trust-out")
    if args.trust_out and not (args.scope or args.cluster):
        raise UsageError("--trust-out needs at least one --scope or --cluster PATTERN")
    passphrase = _passphrase(args)
    key = SigningKey.generate()
    trusted = None
    if args.trust_out:  # check the trust file's fields before writing anything
        name = args.name or args.output.name.removesuffix(".pem").removesuffix(".key")
        trusted = trusted_key(
            name,
            key.public_raw,
            args.scope,
            thresholds=_thresholds(args.threshold),
            cluster=args.cluster,
        )
    write_private_key(key, args.output, passphrase=passphrase, force=args.force)
    print(f"key id:     {key.key_id}")
    print(f"public key: {key.public_b64}")
    print(f"wrote {args.output} (mode 0600{', passphrase-protected' if passphrase else ''})")
    if trusted is not None:
        args.trust_out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.trust_out, trust_file_bytes(trusted))
        print(
            f"wrote {args.trust_out} (name {trusted.name}, scope {', '.join(trusted.scope)}"
            + (f"; cluster {', '.join(trusted.cluster)}" if trusted.cluster else "")
            + ")"
        )
    return 0


def _load_keys(paths: list[Path], args: argparse.Namespace) -> list[SigningKey]:
    from skilld.package import load_private_key

    passphrase = _passphrase(args)
    return [load_private_key(p, passphrase=passphrase) for p in paths]


def run_pack(args: argparse.Namespace) -> int:
    """Handle ``skilld pack``.

    Raises:
        UsageError: no key given, or a key or component that cannot be read.
        PackageFormatError: a bad skill.yaml or an unsafe file under DIR.
        BuildError: building the component failed.
    """
    from skilld.package import pack_directory, read_skill_meta

    if not args.dir.is_dir():
        raise UsageError(f"no such directory: {args.dir}")
    if not args.key and not args.ephemeral_key_out:
        raise UsageError(
            "give --key KEY to sign with, or --ephemeral-key-out DIR for a throwaway key"
        )
    from skilld import agentskills

    if agentskills.is_agent_skill(args.dir):
        return _pack_agent_skill(args, agentskills.read_source(args.dir))
    meta = read_skill_meta(args.dir)  # refuse a bad skill.yaml before building
    keys = _load_keys(args.key, args)
    if args.component is not None:
        try:
            component = args.component.read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read {args.component}: {exc.strerror}") from exc
    else:
        from skilld.package.build import build_component

        print(f"building {args.dir} ...", file=sys.stderr)
        component = build_component(args.dir, cache_dir=args.cache_dir).read_bytes()
    _add_ephemeral_key(args, keys, meta.id)
    data = pack_directory(args.dir, component, keys=keys)
    _write_package(args.output, data, f"{meta.id} {meta.version}")
    return 0


def _add_ephemeral_key(args: argparse.Namespace, keys: list[SigningKey], skill_id: str) -> None:
    """With ``--ephemeral-key-out``, add a throwaway signer scoped to ``skill_id`` to ``keys``
    (made or reused there, with its trust file) and say where its trust file is."""
    from skilld.package import write_ephemeral_signer

    if args.ephemeral_key_out:
        key, trust_file = write_ephemeral_signer(args.ephemeral_key_out, skill_id)
        keys.append(key)
        print(f"ephemeral key {key.key_id}: trust file {trust_file}", file=sys.stderr)


def _write_package(output: Path, data: bytes, what: str) -> None:
    """Write the package ``data`` to ``output`` atomically and print what it holds
    (``what``: the skill and version), its size, digest and signers."""
    from skilld.package import read_package, write_atomic

    write_atomic(output, data)
    contents = read_package(data)
    signers = ", ".join(s.key_id for s in contents.signatures)
    print(
        f"wrote {output}: {what}, {len(data)} bytes, sha256 {contents.sha256}, signed by {signers}"
    )


def _pack_agent_skill(args: argparse.Namespace, source: Any) -> int:
    """``skilld pack`` of an Agent Skills directory (SKILL.md, validated strictly)."""
    from skilld import agentskills

    keys = _load_keys(args.key, args)
    _add_ephemeral_key(args, keys, source.md.id)
    data, version = agentskills.pack(source, keys=keys)
    _write_package(args.output, data, f"Agent Skill {source.md.id} {version}")
    return 0


def run_sign(args: argparse.Namespace) -> int:
    """Handle ``skilld sign``.

    Raises:
        UsageError: the key cannot be read, or the package cannot be rewritten.
        PackageError: the package is damaged (it is left untouched).
    """
    from skilld.package import sign_package

    (key,) = _load_keys([args.key], args)
    if sign_package(args.package, key):
        print(f"signed {args.package} with key {key.key_id}")
    else:
        print(f"{args.package} is already signed by key {key.key_id}; unchanged")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """Handle ``skilld verify``: exit 0 only for a valid package.

    Raises:
        PackageError: the package is invalid; the message says why.
    """
    from skilld.package import load_trust, verify_package

    trust = load_trust(args.trust)
    verified = verify_package(
        args.package, trust, expect_id=args.expect_id, expect_version=args.expect_version
    )
    m = verified.manifest
    signers = [f"{n} ({k})" for n, k in zip(verified.signer_names, verified.signers, strict=True)]
    if args.json:
        print(
            json.dumps(
                {
                    "valid": True,
                    "id": m.id,
                    "version": m.version,
                    "sha256": verified.sha256,
                    "signers": list(verified.signers),
                    "signer_names": list(verified.signer_names),
                },
                indent=2,
            )
        )
    else:
        print(f"OK: {m.id} {m.version} (sha256 {verified.sha256}) signed by {', '.join(signers)}")
    return 0


def _printable(text: str) -> str:
    """``text`` with every non-printable character escaped, for a terminal.

    The manifest refuses control characters, but ``inspect`` reads packages whose
    signatures are not checked, so what it prints from them is escaped here too
    (also invisible format characters such as bidi overrides, which the manifest allows).
    """
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def run_inspect(args: argparse.Namespace) -> int:
    """Handle ``skilld inspect``.

    Raises:
        PackageError: the package's format or digests are broken.
    """
    from skilld.package import read_package

    contents = read_package(args.package)
    m = contents.manifest
    signers = [s.key_id for s in contents.signatures]
    if args.json:
        doc = {
            "sha256": contents.sha256,
            "manifest": m.to_json(),
            "signatures": signers,
            "signatures_verified": False,
        }
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print(f"{m.id} {m.version}: {_printable(m.name)}")
    for line in m.description.splitlines():
        print(f"  {_printable(line)}")
    print(f"package sha256: {contents.sha256}")
    print(f"skill ABI:      {m.abi}")
    print("needs:")
    needs = json.dumps(dict(m.needs), indent=2, sort_keys=True) if m.needs else "(none)"
    print("\n".join(f"  {line}" for line in needs.splitlines()))
    print("files:")
    for f in m.files:
        print(f"  {f.sha256}  {f.size:>10}  {f.name}")
    print("signed by (key ids; not verified here, run 'skilld verify'):")
    print("\n".join(f"  {k}" for k in signers) if signers else "  (unsigned)")
    return 0
