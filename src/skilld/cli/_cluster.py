"""``skilld cluster status``, and the NATS options ``skilld serve --cluster`` shares."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from skilld.errors import UsageError


def add_nats_options(group: Any) -> None:
    """The NATS connection options: credentials and TLS, from files only."""
    group.add_argument(
        "--cluster", metavar="nats://HOST:PORT", help="the NATS server(s), comma-separated"
    )
    group.add_argument("--nats-creds", type=Path, metavar="FILE", help="NATS credentials file")
    group.add_argument("--nats-nkey", type=Path, metavar="FILE", help="NATS nkey seed file")
    group.add_argument(
        "--nats-user-file", type=Path, metavar="FILE", help="a file holding USER:PASSWORD for NATS"
    )
    group.add_argument("--nats-tls-ca", type=Path, metavar="FILE", help="CA bundle for NATS TLS")
    group.add_argument("--nats-tls-cert", type=Path, metavar="FILE", help="client certificate")
    group.add_argument("--nats-tls-key", type=Path, metavar="FILE", help="client certificate's key")


def nats_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ClusterConfig fields the NATS options give."""
    return {
        "url": args.cluster,
        "creds_file": args.nats_creds,
        "nkey_seed_file": args.nats_nkey,
        "user_password_file": args.nats_user_file,
        "tls_ca": args.nats_tls_ca,
        "tls_cert": args.nats_tls_cert,
        "tls_key": args.nats_tls_key,
    }


def register(sub: Any) -> None:
    """Add ``skilld cluster status``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "cluster", help="look at a cluster of skilld nodes", description="Cluster operations."
    )
    csub = p.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    status = csub.add_parser(
        "status",
        help="nodes, roles, skills and versions, last heartbeat, bundle digests",
        description="Listen to the cluster's announcements for --wait seconds and list the "
        "nodes heard. With --bundle, each announcement is verified against that bundle's "
        "trust set, as an entry node would.",
    )
    add_nats_options(status)
    status.add_argument("--bundle", type=Path, help="verify announcements with this bundle's trust")
    status.add_argument(
        "--wait", type=float, default=2.0, metavar="SECONDS", help="how long to listen (2)"
    )
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(handler=run_status)
    conf = csub.add_parser(
        "nats-config",
        help="write a least-privilege nats-server configuration for the cluster's nodes",
        description="Write nats.conf (one account, one NKey user per node with subject "
        "permissions, no anonymous user, TLS), each node's NKey seed (NODE.nk) and a CA with "
        "a server certificate into --out. Keep that directory out of version control.",
    )
    conf.add_argument("--out", type=Path, required=True, help="a new or empty directory")
    conf.add_argument(
        "--node", action="append", required=True, metavar="NAME", help="a node (repeatable)"
    )
    conf.add_argument("--host", default="127.0.0.1", help="the address nats-server listens on")
    conf.add_argument("--port", type=int, default=4222, help="its client port (4222)")
    conf.add_argument(
        "--no-observer", action="store_true", help="no observer user for `skilld cluster status`"
    )
    conf.set_defaults(handler=run_nats_config)


def run_nats_config(args: argparse.Namespace) -> int:
    """Handle ``skilld cluster nats-config``.

    Raises:
        UsageError: an invalid node name, or --out is not empty.
    """
    from skilld.cluster import write_nats_config

    setup = write_nats_config(
        args.out, args.node, host=args.host, port=args.port, observer=not args.no_observer
    )
    print(f"wrote {setup.config}")
    print(f"  nats-server -c {setup.config}")
    for name, seed in setup.seeds.items():
        role = "skilld cluster status" if name == "observer" else f"skilld serve --node {name}"
        print(f"  {role} --cluster {setup.url} --nats-nkey {seed} --nats-tls-ca {setup.ca}")
    if setup.request_state_key is not None:
        print(f"  entry nodes also: --request-state-key {setup.request_state_key}")
    return 0


def run_status(args: argparse.Namespace) -> int:
    """Handle ``skilld cluster status``.

    Raises:
        UsageError: no --cluster, or a credentials file cannot be read.
        ClusterError: NATS cannot be reached.
    """
    from skilld.cluster import ClusterConfig, observe
    from skilld.package import load_trust

    if not args.cluster:
        raise UsageError("--cluster nats://HOST:PORT is required")
    # The observer announces nothing: its name and key are never used.
    config = ClusterConfig(
        node=f"status-{os.getpid()}", key_file=Path(os.devnull), **nats_options(args)
    )
    trust = load_trust(args.bundle / "trust") if args.bundle else None
    nodes = observe(config, trust, args.wait)
    if args.json:
        print(json.dumps({"nodes": nodes, "at": time.time()}, indent=2))
        return 0
    if not nodes:
        print(f"no node announced itself within {args.wait:g}s")
        return 1
    for node in nodes:
        verified = (
            "unverified (no --bundle)"
            if "verified" not in node
            else "verified"
            if node["verified"]
            else f"REFUSED: {node.get('refused')}"
        )
        print(
            f"{node['node']}  roles={','.join(node['roles'])}  bundle={str(node['bundle'])[:16]}  "
            f"last heartbeat {node['last_heartbeat_s']:.1f}s ago  {verified}"
        )
        for skill in node["skills"]:
            print(f"    {skill['id']} {skill['version']}  package {skill['digest'][:16]}")
    return 0
