"""The policy language and its compiler: ``policies/*.yaml`` → permission tables.

Operators write one YAML document per skill (``policies/<skill-id>.yaml``) plus
optional ``policies/defaults.yaml``; the language is documented in
``docs/policy.md``. :func:`compile_policies` parses them (errors carry
``file:line``), intersects each skill's grants with its declared needs and
returns frozen :class:`Tables` (identity: :attr:`Tables.digest`), which
:func:`load_tables` reads back. The checks that consult the tables live in
``skilld.permissions``.
"""

from __future__ import annotations

from skilld.policy._compile import CompileResult, Finding, compile_documents, compile_policies
from skilld.policy._schema import CAPABILITY_SECTIONS, Exposure, parse_grants
from skilld.policy._tables import FORMAT, Tables, load_tables
from skilld.policy._yaml import LMap, load_yaml

__all__ = [
    "CAPABILITY_SECTIONS",
    "FORMAT",
    "CompileResult",
    "Exposure",
    "Finding",
    "LMap",
    "Tables",
    "compile_documents",
    "compile_policies",
    "load_tables",
    "load_yaml",
    "parse_grants",
]
