"""One skill's permission checker, built from the compiled tables.

Everything that can be prepared is prepared at load: globs become regexes, rules
are indexed by directory, host, host suffix, CIDR prefix length and program, so a
check is a handful of dict lookups whatever the number of rules. A check never
raises for a well-formed question: it returns a :class:`~skilld.types.Decision`.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skilld.permissions._url import UrlRefused, normalize_url
from skilld.policy import Exposure, Tables
from skilld.policy import patterns as p
from skilld.types import Decision, Limits

DEFAULT_DENY = "default-deny"
FS_READ_ACTIONS = frozenset({"read", "list", "stat", "glob"})
FS_WRITE_ACTIONS = frozenset({"write", "create", "delete", "remove", "mkdir", "rename"})
# The questions check() does not answer: each is asked typed, with the method named.
_TYPED = {
    "shell.run": "check_argv",
    "http.address": "check_address",
    "tcp.connect": "check_tcp",
    "tcp.address": "check_address",
    **{f"fs.{a}": "check_path" for a in (*FS_READ_ACTIONS, *FS_WRITE_ACTIONS)},
}


@dataclass(frozen=True, slots=True)
class _Net:
    rule: str
    ports: p.PortRanges  # an http rule without a port: its schemes' default ports

    def port_ok(self, port: int) -> bool:
        # A loop, not any(): a generator costs ~0.4 µs, and this runs for each candidate.
        for lo, hi in self.ports:  # noqa: SIM110 - see above
            if lo <= port <= hi:
                return True
        return False


@dataclass(frozen=True, slots=True)
class _Http:
    rule: str
    schemes: frozenset[str]
    host: p.HostPattern
    ports: p.PortRanges | None
    path: str
    methods: frozenset[str]
    allow_private: bool
    addresses: tuple[p.IPNetwork, ...]
    url: str

    def names(self, ip: p.IPAddress) -> bool:
        if self.host.kind == "ip" and self.host.value == str(ip):
            return True
        return any(ip.version == n.version and ip in n for n in self.addresses)


@dataclass(frozen=True, slots=True)
class _Shell:
    rule: str
    fixed: tuple[re.Pattern[str], ...]
    rest: bool
    cwd: tuple[str, ...]
    patterns: tuple[str, ...]


def _default_ports(schemes: frozenset[str]) -> list[int]:
    return sorted({p.default_port(s) for s in schemes})


def _canonical(path: str) -> bool:
    if not path.startswith("/") or "\x00" in path:
        return False
    if path == "/":
        return True
    return not (
        path.endswith(("/", "/.", "/..")) or "//" in path or "/./" in path or "/../" in path
    )


def _parents(path: str) -> list[str]:
    out = [path]
    while path != "/":
        path = path[: path.rfind("/")] or "/"
        out.append(path)
    return out


def _named(
    named: Mapping[tuple[int, int], Mapping[int, Sequence[_Net]]],
    addr: p.IPAddress,
    port: int,
    only: frozenset[str] | None = None,
) -> _Net | None:
    value = int(addr)
    width = 32 if addr.version == 4 else 128
    for (version, prefixlen), networks in named.items():
        if version != addr.version:
            continue
        shift = width - prefixlen
        for net in networks.get((value >> shift) << shift, ()):
            if net.port_ok(port) and (only is None or net.rule in only):
                return net
    return None


# An address rule as a host-scoped check sees it: its position in table order, the
# rule, and whether it has allow_private.
_Entry = tuple[int, _Net, bool]
# (rule ids that may decide, or None for all; allow_private rules; rules), in table order.
_Scope = tuple[frozenset[str] | None, Sequence[_Net], Sequence[_Net]]
_NO_SCOPE: _Scope = (frozenset(), (), ())


def _scope_of(entries: Sequence[_Entry]) -> _Scope:
    return (
        frozenset(net.rule for _, net, _ in entries),
        tuple(net for _, net, allow in entries if allow),
        tuple(net for _, net, _ in entries),
    )


def _order(entry: _Entry) -> int:
    return entry[0]


class _Group:
    """The address rules for one host key, in table order, with their scope made at load."""

    __slots__ = ("entries", "scope")

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.scope = _NO_SCOPE


class _Addresses:
    """One capability's (http or tcp) rules, indexed for :meth:`SkillPermissions.check_address`.

    ``named`` holds the addresses rules name, by (version, prefix length) → network
    number, so an address is looked up once per distinct prefix length, not once per
    rule. ``by_name``, ``by_suffix`` and ``any`` hold the same rules by the host they
    are for, so a check scoped to a host touches only the rules that can match it
    (one dict lookup per label) and still answers with the first matching entry in the
    order given (HTTP gives exact hosts, then suffixes, then wildcards: the most specific
    rule decides; TCP gives table order). Which rule is named can differ between the two
    orders; whether the address is allowed cannot.
    """

    __slots__ = ("any", "by_name", "by_suffix", "depths", "every", "named", "private")

    def __init__(self, entries: Sequence[tuple[p.HostPattern, _Net, Sequence[str], bool]]):
        """Index ``(host pattern, rule, addresses it names, allow_private)`` in table order."""
        self.named: dict[tuple[int, int], dict[int, list[_Net]]] = {}
        self.private: list[_Net] = []
        self.every: list[_Net] = []
        self.by_name: dict[str, _Group] = {}
        self.by_suffix: dict[str, _Group] = {}
        self.any = _Group()
        for order, (host, net, nets, allow) in enumerate(entries):
            self.every.append(net)
            if allow:
                self.private.append(net)
            for text in nets:
                n = ipaddress.ip_network(text)
                key = (n.version, n.prefixlen)
                self.named.setdefault(key, {}).setdefault(int(n.network_address), []).append(net)
            if host.kind == "any":
                group = self.any
            elif host.kind == "suffix":
                group = self.by_suffix.setdefault(host.value, _Group())
            elif host.kind in ("name", "ip"):
                group = self.by_name.setdefault(host.value, _Group())
            else:
                continue
            group.entries.append((order, net, allow))
        for group in (*self.by_name.values(), *self.by_suffix.values(), self.any):
            group.scope = _scope_of(group.entries)
        # How many labels the suffixes have: a name is cut only at those depths.
        self.depths = sorted({suffix.count(".") + 1 for suffix in self.by_suffix})

    def scope(self, host: str | None) -> _Scope:
        """The rules that may decide for ``host`` (see ``_Scope``).

        No host, or an IP literal (which names itself): every rule. A bad host: none.
        """
        if not host:
            return None, self.private, self.every
        try:
            name = p.normalize_host(host)
        except ValueError:
            return _NO_SCOPE
        if not isinstance(name, str):
            return None, self.private, self.every
        groups = []
        group = self.by_name.get(name)
        if group is not None:
            groups.append(group)
        labels = name.count(".") + 1
        for depth in self.depths:  # "*.b.c" and "*.c" for "a.b.c", never "*.a.b.c"
            if depth >= labels:
                break
            group = self.by_suffix.get(name.split(".", labels - depth)[-1])
            if group is not None:
                groups.append(group)
        if self.any.entries:
            groups.append(self.any)
        if len(groups) == 1:
            return groups[0].scope
        return _scope_of(sorted((e for g in groups for e in g.entries), key=_order))


class SkillPermissions:
    """The :class:`~skilld.types.PermissionChecker` of one skill.

    Build it with :meth:`from_tables`. ``limits`` and ``exposure`` carry the
    skill's effective resource limits and MCP presentation.
    """

    def __init__(self, skill_id: str, table: Mapping[str, Any], tables: Tables | None = None):
        """Index ``table`` (one skill's entry of the tables) for fast checks.

        ``tables`` (all skills) is needed to know which callees consent to calls.
        """
        self.skill_id = skill_id
        self._table = table
        self._rules: dict[str, Mapping[str, Any]] = {}
        self._index_fs(table.get("fs", ()))
        self._index_http(table.get("http", ()))
        self._index_tcp(table.get("tcp", ()))
        self._index_shell(table.get("shell", ()))
        self._index_misc(table, tables)
        raw_limits = table.get("limits", {})
        self.limits = Limits(**{k: int(v) for k, v in raw_limits.items()})
        mcp = table.get("mcp", {})
        self.exposure = Exposure(
            per_skill=mcp.get("tools") == "per-skill",
            hidden=tuple(mcp.get("hidden", ())),
            names=dict(mcp.get("names", {})),
            titles=dict(mcp.get("titles", {})),
            descriptions=dict(mcp.get("descriptions", {})),
            client=tuple(mcp.get("client", ())),
            tasks=dict(mcp.get("tasks", {})),
        )

    @classmethod
    def from_tables(cls, tables: Tables, skill_id: str) -> SkillPermissions:
        """The checker for ``skill_id`` (its ``limits`` and ``exposure`` beside it).

        Raises:
            PolicyError: the tables have no entry for the skill.
        """
        return cls(skill_id, tables.skill(skill_id), tables)

    def rule(self, rule_id: str) -> Mapping[str, Any] | None:
        """The table entry of a rule (e.g. a shell rule's ``timeout_ms`` and ``env``)."""
        return self._rules.get(rule_id)

    def grant_root(self, rule_id: str) -> str | None:
        """The directory an fs rule's path starts from: its literal part before any wildcard.

        The host resolves a granted path beneath it (``fs`` opens it first, then the
        rest of the path from its descriptor). ``None`` for a rule that is not an fs rule.
        """
        return self._fs_roots.get(rule_id)

    def grants(self, capability: str) -> tuple[Mapping[str, Any], ...]:
        """The skill's rules for ``capability`` (``fs``, ``tcp``, ...), in table order.

        For what the kernel enforces beside the checks: a confined command's Landlock
        ruleset is built from the ``fs`` and ``tcp`` grants.
        """
        return tuple(self._table.get(capability, ()))

    # -- indexing ----------------------------------------------------------

    def _keep(self, rule: Mapping[str, Any]) -> str:
        rid = str(rule["id"])
        self._rules[rid] = rule
        return rid

    def _index_fs(self, rules: Sequence[Mapping[str, Any]]) -> None:
        self._fs_tree: dict[str, list[tuple[str, bool]]] = {}
        self._fs_glob: dict[str, list[tuple[re.Pattern[str], str, bool, str]]] = {}
        self._fs_roots: dict[str, str] = {}
        for r in rules:
            rid, rw = self._keep(r), r["mode"] == "rw"
            segments = p.parse_path_pattern(r["path"])
            self._fs_roots[rid] = p.literal_prefix(segments)
            if p.is_literal(segments):
                self._fs_tree.setdefault(p.join_path(segments), []).append((rid, rw))
            else:
                rx = re.compile(p.path_regex(segments))
                self._fs_glob.setdefault(p.literal_prefix(segments), []).append(
                    (rx, rid, rw, r["path"])
                )
        for group in self._fs_tree.values():
            group.sort(key=lambda x: not x[1])  # rw first: one pass answers reads and writes

    def _index_http(self, rules: Sequence[Mapping[str, Any]]) -> None:
        self._http_host: dict[str, list[_Http]] = {}
        self._http_suffix: dict[str, list[_Http]] = {}
        self._http_any: list[_Http] = []
        for r in rules:
            host = p.parse_host_pattern(r["host"], cidr=False)
            ports = tuple((lo, hi) for lo, hi in r["ports"]) if r["ports"] else None
            rule = _Http(
                self._keep(r),
                frozenset(r["schemes"]),
                host,
                ports,
                r["path"],
                frozenset(r["methods"]),
                bool(r["allow_private"]),
                tuple(ipaddress.ip_network(a) for a in r["addresses"]),
                r["url"],
            )
            if host.kind == "any":
                self._http_any.append(rule)
            elif host.kind == "suffix":
                self._http_suffix.setdefault(host.value, []).append(rule)
            else:
                self._http_host.setdefault(host.value, []).append(rule)
        self._http_addr = _Addresses(
            [
                (
                    r.host,
                    _Net(r.rule, r.ports or tuple((d, d) for d in _default_ports(r.schemes))),
                    ([r.host.value] if r.host.kind == "ip" else []) + [str(n) for n in r.addresses],
                    r.allow_private,
                )
                for group in (
                    *self._http_host.values(),
                    *self._http_suffix.values(),
                    self._http_any,
                )
                for r in group
            ]
        )

    def _index_tcp(self, rules: Sequence[Mapping[str, Any]]) -> None:
        self._tcp_host: dict[str, list[tuple[_Net, bool]]] = {}
        self._tcp_suffix: dict[str, list[tuple[_Net, bool]]] = {}
        self._tcp_any: list[tuple[_Net, bool]] = []
        entries = []
        for r in rules:
            host = p.parse_host_pattern(r["host"], cidr=True)
            net = _Net(self._keep(r), tuple((lo, hi) for lo, hi in r["ports"]))
            allow = bool(r["allow_private"])
            if host.kind == "any":
                self._tcp_any.append((net, allow))
            elif host.kind == "suffix":
                self._tcp_suffix.setdefault(host.value, []).append((net, allow))
            elif host.kind in ("name", "ip"):
                self._tcp_host.setdefault(host.value, []).append((net, allow))
            named = [host.value] if host.kind in ("ip", "cidr") else []
            entries.append((host, net, named, allow))
        self._tcp_addr = _Addresses(entries)

    def _index_shell(self, rules: Sequence[Mapping[str, Any]]) -> None:
        self._shell: dict[str, list[_Shell]] = {}
        self._shell_cwd: list[tuple[str, str]] = []
        for r in rules:
            args = tuple(r["args"])
            rest = bool(args) and args[-1] == "**"
            fixed = args[:-1] if rest else args
            rule = _Shell(
                self._keep(r),
                tuple(re.compile(p.arg_regex(a), re.DOTALL) for a in fixed),
                rest,
                tuple(r["cwd"]),
                args,
            )
            self._shell.setdefault(r["program"], []).append(rule)
            self._shell_cwd += [(d, rule.rule) for d in rule.cwd]

    def _index_misc(self, table: Mapping[str, Any], tables: Tables | None) -> None:
        self._env_exact: dict[str, str] = {}
        self._env_prefix: list[tuple[str, str]] = []
        for r in table.get("env", ()):
            rid, name = self._keep(r), r["name"]
            if name.endswith("*"):
                self._env_prefix.append((name[:-1], rid))
            else:
                self._env_exact.setdefault(name, rid)
        self._transfer = [
            (
                self._keep(r),
                tuple(re.compile(p.arg_regex(n)) for n in r["nodes"]),
                tuple(r["paths"]),
                r["mode"] == "rw",
            )
            for r in table.get("transfer", ())
        ]
        self._kv: str | None = None
        if table.get("kv"):
            self._kv = self._keep(table["kv"])
        self._invoke: Mapping[str, Any] | None = table.get("invoke")
        self._consenting: frozenset[str] = frozenset()
        if self._invoke is not None:
            self._keep(self._invoke)
            consenting = set()
            for callee in self._invoke["calls"]:
                other = tables.data["skills"].get(callee) if tables is not None else None
                inv = other.get("invoke") if other else None
                if inv and (self.skill_id in inv["called_by"] or "*" in inv["called_by"]):
                    consenting.add(callee)
            self._consenting = frozenset(consenting)
        self._client = frozenset(table.get("mcp", {}).get("client", ()))

    # -- decisions -----------------------------------------------------------

    def _allow(self, cap: str, action: str, target: str, rule: str, reason: str) -> Decision:
        return Decision(True, cap, action, target, rule, reason)

    def _deny(
        self, cap: str, action: str, target: str, reason: str, rule: str = DEFAULT_DENY
    ) -> Decision:
        return Decision(False, cap, action, target, rule, reason)

    def check(self, capability: str, action: str, target: str) -> Decision:
        """Decide one question whose target is one plain string (:class:`PermissionChecker`).

        ``shell``: cwd DIR; ``env``: read NAME; ``invoke``: call SKILL, or called-by
        NODE/SKILL (a cluster node's skill); ``transfer``: send|fetch NODE:PATH; ``kv``:
        any action; ``mcp``: sample|elicit. A path, a URL, a command, an address and a
        connection are asked typed (:meth:`check_path`, :meth:`check_url`,
        :meth:`check_argv`, :meth:`check_address`, :meth:`check_tcp`); their text
        forms are ``skilld.permissions.check_text``'s, for people.
        """
        try:
            return self._check(capability, action, target)
        except ValueError as exc:
            return self._deny(
                capability, action, target, f"malformed request: {exc}", "bad-request"
            )

    def _check(self, capability: str, action: str, target: str) -> Decision:
        if capability == "shell" and action == "cwd":
            return self.check_cwd(target)
        if capability == "env" and action == "read":
            return self.check_env(target)
        if capability == "invoke" and action == "call":
            return self.check_invoke(target)
        if capability == "invoke" and action == "called-by":
            node, slash, caller = target.rpartition("/")
            if not slash:
                return self._deny(
                    capability, action, target, "name the caller as NODE/SKILL", "bad-request"
                )
            return self.check_remote_caller(node, caller)
        if capability == "transfer" and action in ("send", "fetch"):
            node, _, path = target.partition(":")
            return self.check_transfer(node, path, fetch=action == "fetch")
        if capability == "kv":
            if self._kv is not None:
                return self._allow("kv", action, target, self._kv, "the skill has a namespace")
            return self._deny("kv", action, target, "no kv grant; add 'kv: {}' to the policy")
        if capability == "log":
            return self._allow("log", action, target, "builtin.log", "logging is always allowed")
        if capability == "mcp":
            if action in self._client:
                return self._allow("mcp", action, target, f"{self.skill_id}.mcp", "mcp.client")
            return self._deny("mcp", action, target, f"add '{action}' to mcp.client to allow")
        ask = _TYPED.get(f"{capability}.{action}")
        if capability == "http" and action != "address":
            ask = "check_url"
        reason = f"ask it typed, with {ask}" if ask else f"unknown question {capability}.{action}"
        return self._deny(capability, action, target, reason, "bad-request")

    def check_path(self, path: str, write: bool = False, *, action: str | None = None) -> Decision:
        """May the skill read (or write) the canonical absolute ``path``?

        The caller canonicalises (symlinks resolved, no ``.``/``..``); a
        non-canonical path is refused, never interpreted.
        """
        act = action or ("write" if write else "read")
        if not _canonical(path):
            return self._deny("fs", act, path, "the path is not canonical", "fs.not-canonical")
        read_only: str | None = None
        for parent in _parents(path):
            for rid, rw in self._fs_tree.get(parent, ()):
                if rw or not write:
                    return self._allow(
                        "fs", act, path, rid, f"under {parent} ({'rw' if rw else 'ro'})"
                    )
                read_only = read_only or rid
            for rx, rid, rw, pattern in self._fs_glob.get(parent, ()):
                if rx.fullmatch(path):
                    if rw or not write:
                        return self._allow("fs", act, path, rid, f"matches {pattern}")
                    read_only = read_only or rid
        if read_only is not None:
            return self._deny(
                "fs", act, path, f"{read_only} grants read only; it needs mode: rw", read_only
            )
        return self._deny(
            "fs",
            act,
            path,
            f"no fs rule covers {path}; add '- path: {path}' ({'rw' if write else 'ro'})",
        )

    def check_url(self, url: str, method: str = "GET") -> Decision:
        """May the skill send ``method`` to ``url`` (normalised first)?"""
        method = method.upper()
        try:
            u = normalize_url(url)
        except UrlRefused as exc:
            return self._deny("http", method, url, str(exc), exc.rule)
        candidates = list(self._http_host.get(u.host, ()))
        if u.ip is None:
            labels = u.host.split(".")
            for i in range(1, len(labels)):
                candidates += self._http_suffix.get(".".join(labels[i:]), ())
        candidates += self._http_any
        near: _Http | None = None
        for r in candidates:
            if u.scheme not in r.schemes or not p.path_under(u.path, r.path):
                continue
            if r.ports is None:
                if u.port != p.default_port(u.scheme):
                    continue
            elif not p.port_in(u.port, r.ports):
                continue
            if (
                u.ip is not None
                and p.is_special(u.ip)
                and not (r.names(u.ip) or (r.allow_private and u.ip not in p.METADATA))
            ):
                continue
            if method not in r.methods:
                near = near or r
                continue
            return self._allow("http", method, url, r.rule, f"under {r.url}")
        if near is not None:
            allowed = ", ".join(sorted(near.methods))
            return self._deny(
                "http", method, url, f"{near.rule} allows {allowed}, not {method}", near.rule
            )
        port = "" if u.port == p.default_port(u.scheme) else f":{u.port}"
        host = f"[{u.host}]" if ":" in u.host else u.host
        shown = f"{u.scheme}://{host}{port}{u.path}"
        if u.ip is not None and p.is_special(u.ip):
            kind = "a cloud metadata" if u.ip in p.METADATA else "a private or local"
            return self._deny(
                "http", method, url, f"{u.ip} is {kind} address; a rule must name it explicitly"
            )
        return self._deny(
            "http", method, url, f"no http rule allows {method} {shown}; add '- url: {shown}'"
        )

    def check_address(
        self, ip: str, port: int, capability: str = "http", host: str | None = None
    ) -> Decision:
        """May the skill's ``capability`` (http or tcp) connect to the resolved ``ip``?

        Private, loopback, link-local and metadata addresses need a rule that names
        them (an IP, a CIDR, ``addresses:``); ``allow_private`` covers all but metadata.
        With ``host`` (the name that resolved to ``ip``; string form ``"IP:PORT HOST"``)
        only the rules that match that host count, so one rule's ``allow_private``
        cannot help another host that resolves to a private address.
        """
        target = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        if host:
            target = f"{target} {host}"
        if not 1 <= port <= 65535:
            reason = f"port out of range in {target!r}"
            return self._deny(capability, "address", target, reason, "bad-request")
        addresses = self._http_addr if capability == "http" else self._tcp_addr
        # A literal host naming the address itself narrows nothing (saves a parse).
        only, private, every = addresses.scope(None if host == ip else host)
        try:
            addr, shown, metadata, special = p.parse_address(ip.strip("[]"))
        except ValueError:
            return self._deny(
                capability, "address", target, f"{ip!r} is not an IP address", "bad-request"
            )
        hit = _named(addresses.named, addr, port, only) if addresses.named else None
        if hit is not None:
            return self._allow(capability, "address", target, hit.rule, f"{shown} is named")
        if not every:
            scope = f" for {host}" if host else ""
            return self._deny(capability, "address", target, f"no {capability} rule{scope}")
        if metadata:
            return self._deny(
                capability,
                "address",
                target,
                f"{shown} is a cloud metadata address; allow it only by naming it in a rule",
            )
        if special:
            for net in private:
                if net.port_ok(port):
                    return self._allow(capability, "address", target, net.rule, "allow_private")
            return self._deny(
                capability,
                "address",
                target,
                f"{shown} is a private, loopback or link-local address; "
                "name it in a rule or set allow_private: true",
            )
        for net in every:
            if net.port_ok(port):
                return self._allow(capability, "address", target, net.rule, f"{shown} is public")
        return self._deny(capability, "address", target, f"no {capability} rule allows port {port}")

    def check_tcp(self, host: str, port: int) -> Decision:
        """May the skill open a TCP connection to ``host:port`` (before resolution)?"""
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if not 1 <= port <= 65535:
            return self._deny(
                "tcp", "connect", target, f"port out of range in {target!r}", "bad-request"
            )
        try:
            norm = p.normalize_host(host)
        except ValueError as exc:
            return self._deny("tcp", "connect", target, str(exc), "bad-request")
        if isinstance(norm, str):
            candidates = list(self._tcp_host.get(norm, ()))
            labels = norm.split(".")
            for i in range(1, len(labels)):
                candidates += self._tcp_suffix.get(".".join(labels[i:]), ())
            candidates += self._tcp_any
            for net, _allow in candidates:
                if net.port_ok(port):
                    return self._allow("tcp", "connect", target, net.rule, f"{norm} on {port}")
        else:
            hit = _named(self._tcp_addr.named, norm, port)
            if hit is not None:
                return self._allow("tcp", "connect", target, hit.rule, f"{norm} is named")
            special = p.is_special(norm)
            for net, allow_private in self._tcp_any:
                ok = not special or (allow_private and norm not in p.METADATA)
                if ok and net.port_ok(port):
                    return self._allow("tcp", "connect", target, net.rule, f"{norm} on {port}")
            if special:
                return self._deny(
                    "tcp", "connect", target, f"{norm} is a private or metadata address; name it"
                )
        return self._deny(
            "tcp",
            "connect",
            target,
            f"no tcp rule allows {target}; add '- host: {host}' with ports: {port}",
        )

    def check_argv(self, argv: Sequence[str], cwd: str | None = None) -> Decision:
        """May the skill run ``argv`` (in ``cwd``, when given)? Every argument is data.

        The decision names the command quoted (``shlex.join``), for people only.
        """
        target = shlex.join(argv)
        if not argv or not argv[0] or any("\x00" in a for a in argv):
            return self._deny(
                "shell", "run", target, "argv must name a program, no NUL", "bad-request"
            )
        rules = self._shell.get(argv[0])
        if not rules:
            return self._deny(
                "shell",
                "run",
                target,
                f"no shell rule for program {argv[0]!r}; add '- program: {argv[0]}'",
            )
        args = argv[1:]
        mismatch: _Shell | None = None
        for r in rules:
            if len(args) < len(r.fixed) or (len(args) > len(r.fixed) and not r.rest):
                mismatch = mismatch or r
                continue
            if not all(rx.fullmatch(a) for rx, a in zip(r.fixed, args, strict=False)):
                mismatch = mismatch or r
                continue
            if cwd is not None and not (
                _canonical(cwd) and any(p.path_under(cwd, d) for d in r.cwd)
            ):
                return self._deny(
                    "shell",
                    "run",
                    target,
                    f"{r.rule} does not allow working directory {cwd}",
                    r.rule,
                )
            return self._allow("shell", "run", target, r.rule, f"args match {list(r.patterns)}")
        assert mismatch is not None
        return self._deny(
            "shell",
            "run",
            target,
            f"arguments do not match {mismatch.rule} (allows {list(mismatch.patterns)})",
            mismatch.rule,
        )

    def check_cwd(self, cwd: str) -> Decision:
        """May any of the skill's commands run in the canonical directory ``cwd``?"""
        if _canonical(cwd):
            for d, rid in self._shell_cwd:
                if p.path_under(cwd, d):
                    return self._allow("shell", "cwd", cwd, rid, f"under {d}")
        return self._deny("shell", "cwd", cwd, f"no shell rule lists a cwd above {cwd}")

    def check_env(self, name: str) -> Decision:
        """May the skill read the environment variable ``name``?"""
        if name.endswith("*") or not p.NAME_PATTERN.match(name):
            # Not a name a grant could list: "add it to env" would be bad advice
            # ('FOO_*' there grants a family, not the literal name).
            return self._deny(
                "env", "read", name, f"{name!r} is not an environment variable name", "bad-request"
            )
        rid = self._env_exact.get(name)
        if rid is not None:
            return self._allow("env", "read", name, rid, "named")
        for prefix, rid in self._env_prefix:
            if name.startswith(prefix):
                return self._allow("env", "read", name, rid, f"matches {prefix}*")
        return self._deny("env", "read", name, f"add '{name}' to env: to allow")

    def check_invoke(self, callee: str, depth: int = 1, chain: Sequence[str] = ()) -> Decision:
        """May this skill call ``callee`` at ``depth`` (1: a direct call), past ``chain``?

        Both sides must agree: ``callee`` in this skill's ``invoke.calls`` and this
        skill in the callee's ``invoke.called_by``. A callee already on the call
        ``chain`` (or this skill itself) is a cycle and refused.
        """
        inv = self._invoke
        if callee == self.skill_id or callee in chain:
            ring = " → ".join([*chain, self.skill_id, callee])
            return self._deny("invoke", "call", callee, f"cycle {ring}", "invoke.cycle")
        remote = inv is not None and callee in inv.get("remote_calls", ())
        if inv is None or (callee not in inv["calls"] and not remote):
            return self._deny(
                "invoke",
                "call",
                callee,
                f"add '{callee}' to invoke.calls (or to invoke.remote_calls when other "
                "nodes of the cluster hold it)",
            )
        rid = inv["id"]
        if depth > inv["max_depth"]:
            return self._deny(
                "invoke", "call", callee, f"depth {depth} exceeds max_depth {inv['max_depth']}", rid
            )
        if remote:
            # The holder checks its own consent (remote_called_by) under its own policy.
            return self._allow(
                "invoke",
                "call",
                callee,
                rid,
                f"remote, depth {depth} of {inv['max_depth']}; consent is the holder's",
            )
        if callee not in self._consenting:
            return self._deny(
                "invoke",
                "call",
                callee,
                f"'{callee}' does not list '{self.skill_id}' in invoke.called_by",
            )
        return self._allow("invoke", "call", callee, rid, f"depth {depth} of {inv['max_depth']}")

    def check_remote_caller(self, node: str, caller: str) -> Decision:
        """May skill ``caller`` of cluster node ``node`` invoke this skill?

        This node's own consent for a routed ``invoke``: an entry of the skill's
        ``invoke.remote_called_by`` (``SKILL``, ``NODE/SKILL`` or ``*``, ``*`` a glob
        in NODE) must match; the caller's node already checked its ``remote_calls``.
        """
        target = f"{node}/{caller}"
        inv = self._invoke or {}
        rid = inv.get("id", DEFAULT_DENY)
        for entry in inv.get("remote_called_by", ()):
            want_node, _, want_skill = entry.rpartition("/")
            if want_skill in ("*", caller) and (
                not want_node or re.fullmatch(p.arg_regex(want_node), node)
            ):
                return self._allow("invoke", "called-by", target, rid, f"matches {entry}")
        return self._deny(
            "invoke",
            "called-by",
            target,
            f"'{self.skill_id}' does not list '{caller}' or '{target}' in invoke.remote_called_by",
            rid,
        )

    def may_transfer_with(self, node: str) -> bool:
        """True when some transfer rule names ``node`` (``transfer.nodes`` lists it)."""
        return any(rx.fullmatch(node) for _rid, nodes, _dirs, _rw in self._transfer for rx in nodes)

    def check_transfer(self, node: str, path: str, fetch: bool = False) -> Decision:
        """May the skill send ``path`` to ``node`` (or fetch into it, ``fetch=True``)?"""
        action = "fetch" if fetch else "send"
        target = f"{node}:{path}"
        if _canonical(path):
            for rid, nodes, dirs, rw in self._transfer:
                if (
                    (rw or not fetch)
                    and any(rx.fullmatch(node) for rx in nodes)
                    and any(p.path_under(path, d) for d in dirs)
                ):
                    return self._allow("transfer", action, target, rid, "node and path granted")
        return self._deny("transfer", action, target, f"no transfer rule allows {action} {target}")
