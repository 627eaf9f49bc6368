"""Per-skill key-value state: SQLite by default (NATS KV when clustered).

A :class:`SqliteState` holds one database file for every skill; each skill gets
a :class:`SkillStore` bound to its own namespace, so one skill can never name
another's keys. Writes are committed with ``synchronous=FULL`` in WAL mode
before ``set`` returns: an acknowledged write survives ``kill -9``.
"""

from skilld.state._sqlite import SkillStore, SqliteState

__all__ = ["SkillStore", "SqliteState"]
