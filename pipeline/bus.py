"""The bus: one node instance's topics and services, over ``zmq.asyncio``.

This module is the facade a node uses (``node.bus.publisher/subscriber/server/client``); the
delivery classes live in their own modules:

* :mod:`pipeline.reliable`: consumer groups, credit, acknowledgement, redelivery, batches;
* :mod:`pipeline.broadcast`: ``latest`` and ``lossy`` topics (XPUB/SUB) and monitor taps;
* :mod:`pipeline.reqrep`: request/reply services;
* :mod:`pipeline.topics`: delivery class names, :class:`TopicSpec`, :class:`TopicStats`.

The endpoints never see the bus: each gets the instance's
:class:`~pipeline.endpoint_context.EndpointContext` (name, socket factory, the watermark and
acknowledgement hooks), so the imports run one way, from here down.
"""

from __future__ import annotations

import time

from pipeline.broadcast import BroadcastPublisher, BroadcastSubscriber
from pipeline.endpoint_context import EndpointContext
from pipeline.ports import PortNotListed
from pipeline.reliable import WINDOW_BYTES, ReliablePublisher
from pipeline.reliable_subscriber import ReliableSubscriber
from pipeline.reqrep import ServerGone, ServiceClient, ServiceServer
from pipeline.sockets import SocketFactory
from pipeline.topics import (
    DELIVERY_CLASSES,
    HWM_BYTES,
    LATEST,
    LOSSY,
    RELIABLE,
    TopicSpec,
    TopicStats,
    partition_group,
)

__all__ = ["DELIVERY_CLASSES", "HWM_BYTES", "LATEST", "LOSSY", "RELIABLE", "WINDOW_BYTES",
           "Bus", "BroadcastPublisher", "BroadcastSubscriber", "PortNotListed",
           "ReliablePublisher", "ReliableSubscriber", "ServerGone", "ServiceClient",
           "ServiceServer", "TopicSpec", "TopicStats"]


class Bus:
    """One node instance's view of the graph's topics and services.

    The runtime creates it with the endpoints this instance binds; :meth:`set_peers` (called at
    start and whenever the supervisor reports a change) connects subscriptions and clients to
    every live publisher and server.
    """

    def __init__(self, instance: str, group: str, topics: dict[str, TopicSpec],
                 bind_endpoints: dict[str, str], consumer_groups: dict[str, list[str]],
                 sockets: SocketFactory | None = None, subscriptions: tuple = (),
                 listed: dict | None = None, replica: int = 0):
        """``listed`` (given by the node runtime) maps ``subscribes`` and/or ``calls`` to the
        names the graph entry lists; asking for any other is a :class:`PortNotListed` at once.
        Publishing and serving are always limited to ``bind_endpoints``."""
        self.instance, self.group = instance, group
        self.replica = replica  # which consumer group it joins on a partitioned topic
        self.listed = listed or {}
        self.topics = topics
        self.bind_endpoints = bind_endpoints
        self.consumer_groups = consumer_groups
        self.subscriptions = tuple(subscriptions)
        self.sockets = sockets or SocketFactory()
        self.publishers: dict[str, ReliablePublisher | BroadcastPublisher] = {}
        self._reliable: list[ReliablePublisher] = []  # the reliable ones, for watermark()
        self._coalescing: list[ReliablePublisher] = []  # those of coalescing topics
        self.subscribers: dict[str, ReliableSubscriber | BroadcastSubscriber] = {}
        self.servers: dict[str, ServiceServer] = {}
        self.clients: dict[str, ServiceClient] = {}
        self._peers: dict = {"topics": {}, "services": {}}
        # What the endpoints get instead of the bus (they sit below it, see endpoint_context).
        self.context = EndpointContext(instance, self.sockets, self._reliable, self.watermark,
                                       self.on_output_acknowledged)

    # factories used by node code ---------------------------------------------------------------

    def publisher(self, topic: str):
        if topic not in self.publishers:
            spec = self._spec(topic)
            endpoint = self._bind_endpoint(topic)
            if spec.delivery == RELIABLE:
                pub = ReliablePublisher(self.context, topic, endpoint, spec.hwm,
                                        self.consumer_groups.get(topic, []), spec.hwm_bytes,
                                        spec.coalesce)
                self._reliable.append(pub)
                if spec.coalesce:
                    self._coalescing.append(pub)
            else:
                pub = BroadcastPublisher(self.context, topic, endpoint, spec.hwm,
                                         spec.delivery)
            self.publishers[topic] = pub
        return self.publishers[topic]

    def subscriber(self, topic: str, window: int | None = None,
                   window_bytes: int = WINDOW_BYTES):
        """The subscription to ``topic``; on a reliable topic each publisher may have
        ``window`` messages (default: the topic's hwm, at most 256) and ``window_bytes``
        bytes delivered and not yet acknowledged."""
        if topic not in self.subscribers:
            self._check_listed("subscribes", topic)
            spec = self._spec(topic)
            if spec.delivery == RELIABLE:
                group = partition_group(self.group, self.replica) if spec.partitioned \
                    else self.group
                sub = ReliableSubscriber(self.context, topic,
                                         window or max(1, min(spec.hwm, 256)), window_bytes,
                                         group)
            else:
                sub = BroadcastSubscriber(self.context, topic, spec.delivery,
                                          hwm=2 if spec.delivery == LATEST else spec.hwm)
            sub.set_endpoints(self._peers["topics"].get(topic, []))
            self.subscribers[topic] = sub
        return self.subscribers[topic]

    def server(self, service: str) -> ServiceServer:
        if service not in self.servers:
            self.servers[service] = ServiceServer(self.context, service,
                                                  self._bind_endpoint(service))
        return self.servers[service]

    def client(self, service: str) -> ServiceClient:
        if service not in self.clients:
            self._check_listed("calls", service)
            client = ServiceClient(self.context, service)
            client.set_endpoints(self._peers["services"].get(service, []))
            self.clients[service] = client
        return self.clients[service]

    def watermark(self) -> tuple:
        """``(publisher, seq)`` for every reliable publisher of this node with messages not
        yet acknowledged by all its consumers: an input handled now may be acknowledged only
        once each of those publishers completed through ``seq``."""
        if not self._reliable:
            return ()
        for pub in self._coalescing:  # what they hold counts as published
            pub.release_held()
        return tuple((pub, pub.seq) for pub in self._reliable if pub.completed_through < pub.seq)

    def hold_acks(self, gate) -> None:
        """Make ``gate`` (attributes ``seq`` and ``completed_through``) part of the watermark:
        an input handled while ``gate.seq > gate.completed_through`` is acknowledged only once
        the gate completed through that ``seq``; call :meth:`on_output_acknowledged` after
        advancing it. A node that keeps state durably (the demo sink) acknowledges only what it
        has written, so a kill -9 loses nothing it had acknowledged (issue 11, exactly-once)."""
        self._reliable.append(gate)

    def on_output_acknowledged(self) -> None:
        for sub in self.subscribers.values():
            if isinstance(sub, ReliableSubscriber):
                sub.on_output_acknowledged()

    def publishes(self, name: str) -> bool:
        """Whether the graph has this node publish the topic (or serve the service) ``name``."""
        return name in self.bind_endpoints

    def subscribes(self, topic: str) -> bool:
        """Whether the graph has this node subscribe to ``topic``."""
        return topic in self.subscriptions

    def _spec(self, topic: str) -> TopicSpec:
        if topic not in self.topics:
            raise PortNotListed(f"node {self.group!r}: topic {topic!r} is not declared under "
                                f"topics in the graph")
        return self.topics[topic]

    def _bind_endpoint(self, name: str) -> str:
        if name not in self.bind_endpoints:
            section = "publishes" if name in self.topics else "serves"
            raise PortNotListed(f"node {self.group!r} {section[:-1]}s {name!r}, but its graph "
                                f"entry does not list it under {section} (it lists: "
                                f"{', '.join(sorted(self.bind_endpoints)) or 'nothing'})")
        return self.bind_endpoints[name]

    def _check_listed(self, section: str, name: str) -> None:
        names = self.listed.get(section)
        if names is not None and name not in names:
            verb = "subscribes to" if section == "subscribes" else "calls"
            raise PortNotListed(f"node {self.group!r} {verb} {name!r}, but its graph entry "
                                f"does not list it under {section} (it lists: "
                                f"{', '.join(names) or 'nothing'})")

    # wiring ------------------------------------------------------------------------------------

    def bind_all(self) -> None:
        """Create every publisher and server this instance declares."""
        for name in self.bind_endpoints:
            if name in self.topics:
                self.publisher(name)
            else:
                self.server(name)

    def bound_endpoints(self) -> dict[str, str]:
        """Actual endpoints (tcp ports resolved), including reliable topics' monitor taps."""
        out = {name: part.endpoint for name, part in {**self.publishers, **self.servers}.items()}
        for name, pub in self.publishers.items():
            if isinstance(pub, ReliablePublisher):
                out[f"{name}.tap"] = pub.tap.endpoint
        return out

    def set_peers(self, topics: dict, services: dict, gone: list | tuple = ()) -> None:
        self._peers = {"topics": topics, "services": services}
        if gone:
            for pub in self.publishers.values():
                if isinstance(pub, ReliablePublisher):
                    pub.drop_instances(set(gone))
        for topic, sub in self.subscribers.items():
            sub.set_endpoints(topics.get(topic, []))
        for service, client in self.clients.items():
            client.set_endpoints(services.get(service, []))

    # lifecycle ---------------------------------------------------------------------------------

    def leave_all(self) -> None:
        for sub in self.subscribers.values():
            if isinstance(sub, ReliableSubscriber):
                sub.leave()

    async def flush(self, timeout: float, present_only: bool = False) -> bool:
        """Wait until every reliable message this instance published was acknowledged (the
        result: whether they were) and every reply its servers sent was written out.
        ``present_only``: by the consumer groups connected now (``ReliablePublisher.flush``)."""
        deadline = time.monotonic() + timeout
        ok = True
        for pub in self.publishers.values():
            ok &= await pub.flush(max(0.0, deadline - time.monotonic()), present_only)
        for server in self.servers.values():  # replies are not the topics' ledger: not in ok
            await server.flush(max(0.0, deadline - time.monotonic()))
        return ok

    def pending(self) -> int:
        """Reliable messages some consumer group has not acknowledged."""
        return sum(pub.pending() for pub in self.publishers.values())

    def stats(self) -> dict:
        out = {}
        for name, part in [*self.publishers.items(), *self.subscribers.items(),
                           *self.servers.items(), *self.clients.items()]:
            role = ("pub" if part in self.publishers.values() else
                    "sub" if part in self.subscribers.values() else
                    "srv" if part in self.servers.values() else "cli")
            out[f"{role}:{name}"] = part.stats.as_dict()
        return out

    def close(self) -> None:
        """Close in LIFO order: clients, servers, subscribers, publishers, then any leftover."""
        for group in (self.clients, self.servers, self.subscribers, self.publishers):
            for part in reversed(list(group.values())):
                part.close()
            group.clear()
        self._reliable.clear()
        self.sockets.close_all()
