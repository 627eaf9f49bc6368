"""The one error tree of skilld.

Every error a user can see is a :class:`SkilldError`. It carries what happened
(the message), where (``location``: a file and line, a skill, a rule id) and,
where there is one, what to do (``hint``). Third-party exceptions are translated
into this tree at the one boundary that uses the library (``raise X(...) from exc``).

::

    SkilldError
    ├── UsageError              bad command-line or configuration input
    ├── BuildError              a skill could not be built from source (shows the traceback)
    ├── PackageError            a .skill package cannot be used
    │   ├── PackageFormatError      malformed archive or manifest, limits exceeded
    │   ├── DigestMismatch          a file's bytes differ from its recorded sha256
    │   ├── SignatureError          a signature is missing, malformed or invalid
    │   └── TrustError              unknown key, key outside its scope, threshold unmet
    ├── PolicyError             a policy document cannot be compiled (file:line)
    ├── PermissionDenied        a permission check said no (rule id and reason)
    ├── SandboxError            the wasm engine could not run a guest
    │   ├── CompileError            the component does not compile or load
    │   ├── LinkError               the component imports what the host will not give it
    │   └── GuestFault              the guest failed, costing this one call
    │       ├── GuestTrap               a trap (unreachable, bad memory access, ...)
    │       ├── DeadlineExceeded        the call ran past its wall-clock deadline
    │       ├── CallCancelled           the client cancelled the call; the guest was stopped
    │       ├── MemoryExhausted         the guest hit its memory cap
    │       └── StackExhausted          the guest overflowed its stack
    ├── GuestError              the guest returned a typed error (code, message, rule)
    │   └── SkillBusy               every slot of the skill is taken (``skilld.call.CallGate``)
    ├── HostCallError           a host function refused or failed; the guest gets it typed
    ├── StateError              the key-value store failed
    │   └── QuotaExceeded           a value or a skill's total size is over its limit
    ├── AuditError              an audit sink could not record
    ├── RegistryError           an unknown skill, method or tool name
    ├── BundleError             a bundle or its lock is inconsistent (names the file)
    ├── DistributionError       an OCI registry or layout refused, lacks or garbled an artifact
    ├── AgentSkillError         an Agent Skill is invalid or its script cannot run (file:line)
    ├── DelegateError           delegate: an unknown kit, no program for an intent
    │   ├── ProgramRejected         the validator refused a program (line, column, rule)
    │   └── InferenceError          an inference provider failed or answered nonsense
    ├── ClusterError            a NATS peer or route failed
    ├── ConfinementUnavailable  the kernel lacks what a confined process needs (names it)
    └── ProgramNotStarted       a confined program could not be started (errno, path)

Every error carries two names, once, on its class: ``code``, the WIT ``error-code`` a
client or a guest sees (``[timeout] ...``), and ``outcome``, the word its call's audit
record, metrics and delegate's results use (``deadline``). There is no other mapping::

    class              code               outcome
    SkilldError        internal           fault
    UsageError         invalid-argument   error:invalid-argument
    PermissionDenied   not-permitted      error:not-permitted
    GuestFault         fault              fault
    DeadlineExceeded   timeout            deadline
    CallCancelled      cancelled          cancelled
    MemoryExhausted    limit-exceeded     memory
    StackExhausted     limit-exceeded     stack
    GuestError         its own code       error:<code>
    SkillBusy          limit-exceeded     busy
    ServerShutdown     unavailable        shutdown
    RegistryError      internal           unknown
    HostCallError      its own code       error:<code>
    ConfinementUnavailable  confinement-refused  error:confinement-refused

``deadline``, ``memory``, ``stack`` and ``busy`` are also the names of the limits a
record lists under ``limits_hit``.

Outside the tree, :class:`RunOnThread` is a signal between the sandbox and the MCP
layer, never an error anyone reports.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """The WIT ``error-code`` enum, spelled as on the wire: the one place its words live."""

    NOT_PERMITTED = "not-permitted"
    NOT_FOUND = "not-found"
    INVALID_ARGUMENT = "invalid-argument"
    LIMIT_EXCEEDED = "limit-exceeded"
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"
    IO = "io"
    CANCELLED = "cancelled"
    INTERNAL = "internal"


class SkilldError(Exception):
    """Root of every error skilld raises on purpose.

    Args:
        message: what happened, in a sentence.
        location: where: ``file:line``, a skill id, a rule id, a path.
        hint: what the user can do about it.
    """

    # The WIT error code a client sees, and the audit outcome (the module's table).
    code: str = ErrorCode.INTERNAL
    outcome: str = "fault"
    # The policy rule behind a denial, where there is one.
    rule: str | None = None
    # What only the operator may see (the audit record's ``error_detail``), never a client.
    detail: str | None = None

    def __init__(self, message: str, *, location: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.location = location
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.location}: {self.message}" if self.location else self.message
        if self.hint:
            text += f" ({self.hint})"
        return text


class UsageError(SkilldError):
    """Bad command-line or configuration input."""

    code = ErrorCode.INVALID_ARGUMENT
    outcome = f"error:{ErrorCode.INVALID_ARGUMENT}"


class BuildError(SkilldError):
    """A skill could not be built from source; the message carries the build's output."""


class PackageError(SkilldError):
    """A .skill package cannot be used."""


class PackageFormatError(PackageError):
    """A malformed archive or manifest, or a size limit exceeded."""


class DigestMismatch(PackageError):
    """A file's bytes differ from the sha256 recorded for it."""


class SignatureError(PackageError):
    """A signature is missing, malformed or does not verify."""


class TrustError(PackageError):
    """A key is unknown, outside its scope, or a signing threshold is unmet."""


class DistributionError(SkilldError):
    """An OCI registry or image layout refused a request (unauthorized), lacks the artifact
    (not found), holds something else (wrong artifact type, over a size cap) or cannot be
    reached; ``location`` names the reference."""


class PolicyError(SkilldError):
    """A policy document cannot be compiled; ``location`` is ``file:line``."""


class PermissionDenied(SkilldError):
    """A permission check refused an action.

    Args:
        rule: id of the rule that decided (``default-deny`` when none matched).
    """

    code: str = ErrorCode.NOT_PERMITTED
    outcome = f"error:{ErrorCode.NOT_PERMITTED}"

    def __init__(
        self, message: str, *, rule: str, location: str | None = None, hint: str | None = None
    ):
        super().__init__(message, location=location, hint=hint)
        self.rule = rule


class SandboxError(SkilldError):
    """The wasm engine could not run a guest."""


class CompileError(SandboxError):
    """A component does not compile, or its native code does not load."""


class LinkError(SandboxError):
    """A component imports an interface the host will not give it."""


class GuestFault(SandboxError):
    """The guest failed; the failure costs this one call, never the host."""

    code = "fault"


class GuestTrap(GuestFault):
    """The guest trapped (unreachable, out-of-bounds access, a host function fault).

    Args:
        detail: the trap's own text and the guest's stderr (a Rust panic message, a
            Python traceback): kept for the audit record, never shown to a client,
            since it can carry the guest's data or the host's internals.
    """

    def __init__(self, message: str, *, detail: str | None = None, location: str | None = None):
        super().__init__(message, location=location)
        self.detail = detail


class DeadlineExceeded(GuestFault):
    """The call ran past its wall-clock deadline."""

    code = ErrorCode.TIMEOUT
    outcome = "deadline"


class CallCancelled(GuestFault):
    """The client cancelled the call and the guest was stopped where it was."""

    code = ErrorCode.CANCELLED
    outcome = "cancelled"


class MemoryExhausted(GuestFault):
    """The guest tried to grow its memory past its cap."""

    code = ErrorCode.LIMIT_EXCEEDED
    outcome = "memory"


class StackExhausted(GuestFault):
    """The guest overflowed its stack."""

    code = ErrorCode.LIMIT_EXCEEDED
    outcome = "stack"


class GuestError(SkilldError):
    """The guest returned a typed error (the WIT ``error`` record).

    Args:
        code: the WIT error code, e.g. ``not-found``.
        rule: the policy rule behind a ``not-permitted`` error, if any.
    """

    def __init__(
        self, code: str, message: str, *, rule: str | None = None, location: str | None = None
    ):
        super().__init__(message, location=location)
        self.code = code
        self.outcome = f"error:{code}"
        self.rule = rule

    def __str__(self) -> str:
        base = super().__str__()
        rule = f", rule {self.rule}" if self.rule else ""
        return f"[{self.code}{rule}] {base}"


class SkillBusy(GuestError):
    """Every slot of a skill is taken and none freed up in time: the call did not run.

    The one refusal of the one concurrency gate (``skilld.call.CallGate``), whoever
    waited on it: an MCP request on the event loop, a routed call, ``invoke``; and of
    the worker threads when none took the call in time (``message`` says so).
    """

    def __init__(self, skill: str, limit: int, *, message: str | None = None):
        super().__init__(
            ErrorCode.LIMIT_EXCEEDED,
            message or f"skill {skill} is busy ({limit} calls running); retry later",
        )
        self.outcome = "busy"


class ServerShutdown(GuestError):
    """The server's drain grace ran out while the call still ran: it was stopped there.

    Raised once, where the call ends (``skilld.registry``), from the cancellation the
    drain caused; its client is told to retry elsewhere.
    """

    def __init__(self, message: str):
        super().__init__(ErrorCode.UNAVAILABLE, message)
        self.outcome = "shutdown"


class HostCallError(SkilldError):
    """A host function refused or failed; it reaches the guest as the WIT ``error``.

    Args:
        code: the WIT error code, e.g. ``not-permitted``, ``not-found``, ``io``.
        rule: the policy rule id behind a denial, if any.
    """

    def __init__(
        self, code: str, message: str, *, rule: str | None = None, location: str | None = None
    ):
        super().__init__(message, location=location)
        self.code = code
        self.outcome = f"error:{code}"
        self.rule = rule


class StateError(SkilldError):
    """The key-value store failed."""


class QuotaExceeded(StateError):
    """A value, or a skill's total stored size, is over its limit."""


class AuditError(SkilldError):
    """An audit sink could not record."""


class RegistryError(SkilldError):
    """An unknown skill, method or tool name."""

    outcome = "unknown"


class BundleError(SkilldError):
    """A bundle or its lock is inconsistent; ``location`` names the file."""


class AgentSkillError(SkilldError):
    """An Agent Skills directory does not meet the specification, or its script cannot run.

    The message names ``SKILL.md:LINE`` and the field, worded like ``skills-ref``.
    """


class DelegateError(SkilldError):
    """delegate could not serve a request: an unknown kit, no tier produced a program."""


class ProgramRejected(DelegateError):
    """The validator refused a program; ``problems`` holds each (line, column, rule, message).

    Args:
        problems: every problem found, in source order; the first is the message.
    """

    def __init__(self, problems: list[tuple[int, int, str, str]], *, hint: str | None = None):
        line, col, rule, message = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(
            f"{message} [rule {rule}]{more}", location=f"program:{line}:{col}", hint=hint
        )
        self.problems = problems


class InferenceError(DelegateError):
    """An inference provider (Ollama, Anthropic) failed or gave no usable answer."""


class ClusterError(SkilldError):
    """A NATS peer or route failed."""


class ConfinementUnavailable(SkilldError):
    """The kernel lacks a feature a confined process needs; nothing was run.

    A client sees its own code, ``confinement-refused``, and the wall that refused
    (``[confinement-refused] wall seccomp: ...``), never ``internal``: the call was
    refused on purpose, and the operator can act on it. (A guest's ``shell.run`` gets
    the WIT code ``unavailable``: the WIT enum has no such word.)

    Args:
        feature: the wall that refused (``landlock``, ``landlock-tcp``, ``seccomp``,
            ``identity``, ``temp-paths``, ``launcher``, ...).
    """

    code = "confinement-refused"
    outcome = "error:confinement-refused"

    def __init__(self, message: str, *, feature: str, hint: str | None = None):
        super().__init__(message, location=f"wall {feature}", hint=hint)
        self.feature = feature


class ProgramNotStarted(SkilldError):
    """A confined program could not be started (``execve`` or ``chdir`` failed).

    Args:
        errno: the error number (``ENOENT``, ``EACCES`` when Landlock or the file's
            mode refuses to execute it, ...).
    """

    def __init__(self, message: str, *, errno: int, location: str | None = None):
        super().__init__(message, location=location)
        self.errno = errno


class RunOnThread(Exception):
    """An inline attempt at a call gave up: run the call again on a worker thread.

    Not a :class:`SkilldError`: no user ever sees it. It is raised before any guest
    code ran (the sandbox gives every inline attempt up before it takes an instance)
    and before anything was audited, so running the call on a thread runs it once.
    See ``Dispatcher.call_inline``.
    """

    def __init__(self) -> None:
        super().__init__("run the call on a worker thread")
