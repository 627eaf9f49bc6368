"""Many nodes, one set of tools: membership, routing, clustered state over NATS.

Build on what NATS provides and write no membership or consensus protocol of our own:

- **Membership.** Each node publishes a signed announcement (``skilld.announce``) every
  ``heartbeat_s`` (H): its name, roles, bundle digest and skills. A node accepts a
  peer's skills only when its own bundle's trust set holds the signing key with
  ``cluster`` patterns matching the peer's name. A peer silent for 2H-3H is removed,
  as is one that sent a signed leave; a node that lost its own NATS connection
  removes nobody until its connection has been back for a full expiry window.
- **Routing.** Each node serves its skills as a ``nats.micro`` service, one endpoint
  per skill package on a subject of its own (``skilld.call.NODE.SKILL.DIGEST``), so
  ``nats micro ls/info/stats`` see them. Every node adds its peers' skills to its
  registry as :class:`RemoteSkill` backends; the entry picks a replica (round robin),
  sends the call over request/reply, and the holder relays progress, logs, sampling
  and elicitation back; cancellation goes the other way.
- **Trust no one on the bus.** Every message between nodes travels in an envelope
  (``_envelope``: sender, target, call id, caller chain, a stamp accepted once) sealed
  under the key only its two nodes share (signed when the receiver's key is unknown)
  and verified before use; ``skilld cluster nats-config`` writes the
  least-privilege bus (``_natsconf``) that keeps payloads from anyone else, and a node
  on a bus anyone can read says so at start-up.

- **State and files.** With ``kv``, skills' key-value state lives in JetStream KV
  (a bucket per skill); the ``transfer`` host interface moves files between nodes by
  chunked request/reply, each side checking its own policy.

``Cluster`` is what ``skilld.node`` starts for ``skilld serve --cluster``. Only this
package imports ``nats``; its exceptions become :class:`~skilld.errors.ClusterError`.
"""

from skilld.cluster._announce import LocalSkill
from skilld.cluster._cluster import Cluster
from skilld.cluster._config import ClusterConfig
from skilld.cluster._natsconf import NatsSetup, write_nats_config
from skilld.cluster._observe import observe
from skilld.cluster._remote import RemoteSkill
from skilld.cluster._rounds import RoundRelay
from skilld.cluster._tasks import TaskBoard
from skilld.cluster._transfer import FileAccess

__all__ = [
    "Cluster",
    "ClusterConfig",
    "FileAccess",
    "LocalSkill",
    "NatsSetup",
    "RemoteSkill",
    "RoundRelay",
    "TaskBoard",
    "observe",
    "write_nats_config",
]
