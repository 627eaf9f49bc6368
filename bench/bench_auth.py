"""What authenticating a caller costs per request, in process: the SDK's bearer backend
over skilld's verifiers (a JWT, a named token), against no credential at all; a JWT
both as a client sends it (the same token on every request: verified once, then
remembered) and verified afresh each time.

    python bench_auth.py [--requests 20000]

Each case authenticates the same request ``--requests`` times through
``BearerAuthBackend.authenticate`` (what the HTTP app runs for every request) and
reports the median and p99 in microseconds. The end-to-end view is
``bench_mcp.py --auth jwt``; this isolates the verification from the network and the
machine's drift, which at 0.1 ms is larger than the cost measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import jwt
from _util import pct
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
from starlette.requests import HTTPConnection

from skilld.mcp._auth import Credentials, JwksKeys, JwtVerifier, NamedTokens

ISSUER = "https://issuer.bench.invalid"
AUDIENCE = "https://skilld.bench.invalid/mcp"


def _connection(token: str | None) -> HTTPConnection:
    headers = [] if token is None else [(b"authorization", f"Bearer {token}".encode())]
    return HTTPConnection({"type": "http", "headers": headers, "path": "/mcp"})


async def _time(backend: BearerAuthBackend, token: str | None, n: int) -> list[float]:
    conn = _connection(token)
    out = []
    for _ in range(n):
        started = time.perf_counter()
        result = await backend.authenticate(conn)
        out.append(time.perf_counter() - started)
        assert (result is None) == (token is None)
    return out


def _jwt_case(alg: str, cache_s: float = 60.0) -> tuple[Credentials, str]:
    key = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if alg == "RS256"
        else ec.generate_private_key(ec.SECP256R1())
    )
    algo = jwt.algorithms.RSAAlgorithm if alg == "RS256" else jwt.algorithms.ECAlgorithm
    public = json.loads(algo.to_jwk(key.public_key()))
    keys = JwksKeys(fixed={"keys": [{**public, "kid": "k", "alg": alg}]})
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": "bench", "aud": AUDIENCE, "iat": now, "exp": now + 3600}
    token = jwt.encode(claims, key, algorithm=alg, headers={"kid": "k"})
    verifier = JwtVerifier(ISSUER, AUDIENCE, keys, cache_s=cache_s)
    return Credentials(jwt_verifier=verifier), token


async def main(requests: int) -> None:
    """Time each case and print a table."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokens"
        named_token = "n" * 43
        path.write_text(f"bench {named_token}\n")
        path.chmod(0o600)
        named = NamedTokens(path, None)
        named.load()
        cases = [
            ("no credential (auth off path)", Credentials(named=named), None),
            ("named token", Credentials(named=named), named_token),
            ("JWT RS256", *_jwt_case("RS256")),
            ("JWT ES256", *_jwt_case("ES256")),
            ("JWT RS256, every time verified (no cache)", *_jwt_case("RS256", 0)),
            ("JWT ES256, every time verified (no cache)", *_jwt_case("ES256", 0)),
        ]
        print("| caller | p50 µs | p99 µs |")
        print("|---|---|---|")
        for label, credentials, token in cases:
            backend = BearerAuthBackend(credentials)
            await _time(backend, token, 200)  # warm
            lat = await _time(backend, token, requests)
            print(f"| {label} | {statistics.median(lat) * 1e6:.1f} | {pct(lat, 0.99) * 1e6:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    anyio.run(main, parser.parse_args().requests)
