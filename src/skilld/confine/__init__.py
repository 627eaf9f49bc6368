"""Kernel confinement of host processes: the one runner for commands and native scripts.

:func:`run` starts a program confined by the kernel, not by checks in Python:

- **a uid of its own per call** (from its skill's slot of ``SKILLD_SKILL_UIDS``, in the
  skill's group), where skilld may switch uids: no call reaches another's processes;
- **Landlock** (ruleset from a :class:`Confinement`): the files it may read, write and
  execute; TCP ports it may connect to or bind; no signals or abstract unix sockets
  outside its own domain, no ptrace of anything outside it;
- **seccomp**: what Landlock and file modes do not govern (keyrings, unix and raw
  sockets, namespaces, mounts, every call aimed at another pid, System V IPC where no
  IPC namespace is made, metadata where the uid is shared);
- **namespaces** where they can be made (IPC; network only where the other walls leave
  a gap), never required;
- **no_new_privs**, no capabilities (even as root), a cleared environment;
- **rlimits** (:class:`ResourceLimits`) and a memory limit for the whole tree, measured
  by the per-call reaper, which also ends the whole tree with the call.

Where the kernel lacks a feature the confinement needs, :func:`run` raises
:class:`~skilld.errors.ConfinementUnavailable` naming it and runs nothing (tests
simulate that with ``SKILLD_CONFINE_LANDLOCK_ABI``, see :func:`landlock_abi`).
:func:`from_grants` builds a :class:`Confinement` from a skill's compiled fs and tcp
grants. ``docs/confinement.md`` says what each layer stops and what it costs.
"""

from __future__ import annotations

from skilld.confine._client import (
    RUN_AS_ENV,
    Profile,
    drop_privileges,
    profile,
    run_as_from_env,
    shutdown,
    start,
    start_from_env,
)
from skilld.confine._grants import from_grants
from skilld.confine._identity import RANGE_ENV, assign, uid_for, unwritable
from skilld.confine._identity import SLOT as CALL_SLOT
from skilld.confine._runner import (
    DEVICES,
    NETWORK_FILES,
    OUTPUT_CAP,
    SIMULATE_ABI_ENV,
    SYSTEM_LIBRARIES,
    Confinement,
    ProcessResult,
    ResourceLimits,
    landlock_abi,
    program_files,
    require,
    run,
)
from skilld.errors import ConfinementUnavailable, ProgramNotStarted

__all__ = [
    "CALL_SLOT",
    "DEVICES",
    "NETWORK_FILES",
    "OUTPUT_CAP",
    "RANGE_ENV",
    "RUN_AS_ENV",
    "SIMULATE_ABI_ENV",
    "SYSTEM_LIBRARIES",
    "Confinement",
    "ConfinementUnavailable",
    "ProcessResult",
    "Profile",
    "ProgramNotStarted",
    "ResourceLimits",
    "assign",
    "drop_privileges",
    "from_grants",
    "landlock_abi",
    "profile",
    "program_files",
    "require",
    "run",
    "run_as_from_env",
    "shutdown",
    "start",
    "start_from_env",
    "uid_for",
    "unwritable",
]
