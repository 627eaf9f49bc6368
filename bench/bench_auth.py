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
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx2
import jwt
from _util import pct
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
from starlette.requests import HTTPConnection

from skilld.mcp import ServeConfig
from skilld.mcp._auth import Credentials, JwksKeys, JwtVerifier, NamedTokens
from skilld.mcp._http import build_app
from skilld.mcp._logging import make_logger
from skilld.mcp._metrics import Metrics
from skilld.mcp._server import McpService

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
from support.static_dispatcher import echo_dispatcher

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


def _jwt_case(alg: str, cache_s: float = 60.0, scope: str = "") -> tuple[Credentials, str]:
    key = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if alg == "RS256"
        else ec.generate_private_key(ec.SECP256R1())
    )
    algo = jwt.algorithms.RSAAlgorithm if alg == "RS256" else jwt.algorithms.ECAlgorithm
    public = json.loads(algo.to_jwk(key.public_key()))
    keys = JwksKeys(fixed={"keys": [{**public, "kid": "k", "alg": alg}]})
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "sub": "bench",
        "aud": AUDIENCE,
        "scope": scope,
        "iat": now,
        "exp": now + 3600,
    }
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


async def _app_cost(rounds: int, batch: int) -> None:
    """GET /metrics through the whole HTTP app, in process (no sockets): no
    authentication against a JWT caller with the metrics scope, alternating batches."""
    config = ServeConfig(transport="http", log_level="error")
    credentials, token = _jwt_case("RS256", scope="skilld:metrics")
    apps = {}
    for label, creds in (("no auth", Credentials()), ("JWT RS256", credentials)):
        service = McpService(echo_dispatcher(), config, make_logger(config), Metrics())
        apps[label] = build_app(service, creds)
    headers = {"no auth": {}, "JWT RS256": {"Authorization": f"Bearer {token}"}}
    lat: dict[str, list[float]] = {label: [] for label in apps}
    clients = {
        label: httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1"
        )
        for label, app in apps.items()
    }
    for _ in range(rounds):
        for label, client in clients.items():
            for _ in range(batch):
                started = time.perf_counter()
                response = await client.get("/metrics", headers=headers[label])
                lat[label].append(time.perf_counter() - started)
                assert response.status_code == 200, response.text
    for client in clients.values():
        await client.aclose()
    print()
    print("| GET /metrics through the app, in process | p50 µs | p99 µs |")
    print("|---|---|---|")
    for label, values in lat.items():
        print(
            f"| {label} | {statistics.median(values) * 1e6:.1f} | {pct(values, 0.99) * 1e6:.1f} |"
        )
    delta = statistics.median(lat["JWT RS256"]) - statistics.median(lat["no auth"])
    print(f"\nJWT caller over no auth, p50: {delta * 1e6:+.1f} µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument(
        "--quick", action="store_true", help="a few iterations: that it runs (CI; no targets)"
    )
    args = parser.parse_args()
    if args.quick:
        args.requests = 200
    anyio.run(main, args.requests)
    anyio.run(_app_cost, 10, max(1, args.requests // 20))
