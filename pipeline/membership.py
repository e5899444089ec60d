"""Membership that heals, for reliable topics (:mod:`pipeline.reliable`).

A publisher drops a member silent for ``MEMBER_TIMEOUT_S`` and gives what it held to the rest
of its group: a crashed consumer never says goodbye. But a member may be silent and alive: its
process was stopped (SIGSTOP, a paused container) or cut off (a network partition) past the
timeout. When it comes back it still holds messages, handles them and acknowledges them,
counted in order. So the publisher keeps what each evicted member held (:class:`Evictions`),
answers any control from a peer it does not know with ``_REJOIN``, takes the acknowledgements
such a peer sends meanwhile (the messages it handled are done, unless another member took them
first), and when the peer joins again saying how many messages it still holds, gives back
those nobody took and a placeholder for each one somebody did, so its acknowledgements match
what it holds. Nothing is lost; a message two members handled is the at-least-once case that
consumers recognise by its identity, as after a kill -9.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass

# Evicted members remembered so they can rejoin where they were (oldest forgotten first).
DROPPED_KEPT = 256
# A node process sets the timeout from the graph's run.membership_timeout_s
# (reliable.set_member_timeout); tests set this variable to make a partition short (it wins
# over the graph, whose check keeps heartbeat_timeout_s below it, so a stopped node is
# restarted before it is evicted).
MEMBER_TIMEOUT_ENV = "CONDUIT_MEMBER_TIMEOUT_S"


def member_timeout(graph_value: float) -> float:
    override = os.environ.get(MEMBER_TIMEOUT_ENV)
    return float(override) if override else float(graph_value)


@dataclass
class _Evicted:
    """``held``: the messages it had when it was dropped (now back in its group's backlog),
    in delivery order."""

    group: object
    instance: str
    held: collections.deque


class Evictions:
    """The evicted members a publisher keeps (see the module docstring). ``placeholder`` is
    the record that stands for a message the member holds and another took: acknowledging it
    changes nothing, and it is never delivered."""

    def __init__(self, placeholder):
        self.placeholder = placeholder
        self._by_id: collections.OrderedDict = collections.OrderedDict()

    def remember(self, routing_id: bytes, group, member) -> None:
        self._by_id[routing_id] = _Evicted(group, member.instance,
                                           collections.deque(member.inflight))
        while len(self._by_id) > DROPPED_KEPT:
            self._by_id.popitem(last=False)

    def forget_instances(self, gone: set[str]) -> None:
        """Instances that exited: they will not come back."""
        for routing_id, evicted in list(self._by_id.items()):
            if evicted.instance in gone:
                del self._by_id[routing_id]

    def late_acks(self, routing_id: bytes, acked: int) -> bool:
        """Acknowledgements an evicted member sent after it was dropped: the messages it
        handled are done for its group, unless another member took them meanwhile. True if
        some were (the caller advances its completed messages)."""
        evicted = self._by_id.get(routing_id)
        if evicted is None:
            return False
        backlog, done = evicted.group.backlog, False
        for _ in range(min(acked, len(evicted.held))):
            record = evicted.held.popleft()
            if record is not self.placeholder and record in backlog:
                backlog.remove(record)
                record.remaining -= 1
                done = True
        return done

    def reattach(self, group, member, holding: int) -> None:
        """``member`` joined again holding ``holding`` unacknowledged messages: it gets back
        those still waiting in the backlog (it handles them, nobody else) and a placeholder
        for each one another member took. Unknown to us (forgotten): all placeholders."""
        evicted = self._by_id.pop(member.routing_id, None)
        held = evicted.held if evicted is not None and evicted.group is group else ()
        for i in range(holding):
            record = held[i] if i < len(held) else self.placeholder
            if record is not self.placeholder and record in group.backlog:
                group.backlog.remove(record)
                member.credit_bytes -= record.nbytes
            else:
                record = self.placeholder
            member.inflight.append(record)
        member.credit -= holding
