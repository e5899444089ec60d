"""What a bus endpoint (publisher, subscriber, server, client) needs of the node it belongs to.

The endpoints live below :mod:`pipeline.bus`: the :class:`~pipeline.bus.Bus` makes them and
hands each this narrow context instead of itself, so they never import or call the facade.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.sockets import SocketFactory


@dataclass(frozen=True, slots=True)
class EndpointContext:
    """One node instance, as its endpoints see it. The bus builds one and shares it.

    The two hooks are the end-to-end acknowledgement (``Bus.watermark``): a reliable
    subscriber asks ``watermark()`` after each handled message, a reliable publisher calls
    ``on_output_acknowledged()`` when its consumers acknowledged more. Endpoints bind what they
    use per message once, at construction, not through this object on every message.
    """

    instance: str  # the sender name stamped on every message (``node.replica~incarnation``)
    sockets: SocketFactory  # makes and closes every socket of the instance
    # The node's reliable publishers and acknowledgement gates, the list the watermark reads
    # (the bus's own, appended to in place): empty means no watermark to ask for.
    outputs: list
    watermark: Callable[[], tuple]  # (publisher or gate, seq) not yet acknowledged downstream
    on_output_acknowledged: Callable[[], None]  # a reliable output of the node completed more
