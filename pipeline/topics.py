"""What every delivery class shares: the class names, a topic's spec and its counters."""

from __future__ import annotations

from dataclasses import dataclass

RELIABLE, LATEST, LOSSY = "reliable", "latest", "lossy"
DELIVERY_CLASSES = (RELIABLE, LATEST, LOSSY)
HWM_BYTES = 1 << 30  # default per-topic bound on the bytes a publisher holds unacknowledged


@dataclass(frozen=True)
class TopicSpec:
    delivery: str
    hwm: int = 1000  # messages a reliable group may queue
    hwm_bytes: int = HWM_BYTES  # bytes a reliable publisher may hold unacknowledged
    partitioned: bool = False  # each consumer replica its own group; keyed sends pick one
    coalesce: bool = False  # small unkeyed sends of one loop turn go as one batch


def partition_group(node: str, replica: int) -> str:
    """The consumer group of replica ``replica`` of ``node`` on a partitioned topic."""
    return f"{node}/{replica}"


def partition_of(group: str) -> tuple[str, int] | None:
    """``(node, replica)`` of a partition group, or None for a plain (node) group."""
    node, sep, replica = group.rpartition("/")
    return (node, int(replica)) if sep and replica.isdigit() else None


@dataclass
class TopicStats:
    """Counters a node reports in its heartbeat, per topic and direction."""

    sent: int = 0
    received: int = 0
    gaps: int = 0
    malformed: int = 0
    redelivered: int = 0
    dropped: int = 0
    depth: int = 0  # messages waiting (publisher backlog or subscriber queue)
    wait_s: float = 0.0  # time a publisher spent blocked by backpressure
    refused: int = 0  # joins with a wrong token
    evicted: int = 0  # members dropped after MEMBER_TIMEOUT_S of silence
    rejoined: int = 0  # evicted members that joined again (publisher), or times we did (subscriber)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v}
