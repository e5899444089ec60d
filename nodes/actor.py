"""actor: an env runner that acts with its own copy of the policy (no ``policy`` round trip).

An Ape-X / IMPALA actor, DI-engine's collector: the environments and the policy share one
process. It steps its envs as :mod:`nodes.env_runner` does and computes their actions with an
:class:`~nodes.unroller.Unroller` of its own, which takes the learner's ``params`` and
publishes ``experience`` (off-policy) or ``trajectories`` (on-policy) exactly as the unroller
node does: same messages, same ledger, same partitioning by replica, same checkpoint state.

Why a kind of its own: a step of a small batch of envs (64 CartPole envs step in ~0.5 ms)
costs less than the round trip to a policy in another process, its two codec passes and the
wake-ups on both ends; on a machine with few cores that round trip, not the envs, sets the
rate. The unroller node is still the choice when one batched forward pass over many runners
pays (a GPU policy, a large network); the actor when the policy is cheap next to the round
trip.

Its config is the env runner's and the unroller's together. ``max_batch_requests`` does not
apply (the batch is the actor's own env groups that wait), nor ``request_timeout_s``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import NamedTuple

from nodes import env_runner, unroller
from nodes._common import discard_left_state, leave_state
from nodes.messages import ActionBatch, Metrics
from pipeline.ports import Port, Ports


@dataclass(frozen=True)
class Config(env_runner.Config, unroller.Config):
    """The env runner's keys (``num_envs``, ``env_groups``, ``max_steps``, ...) and the
    unroller's (``unroll_length``, ...), and the graph's agent. Replica ``r`` seeds its envs and its
    policy's exploration with ``seed + 1000 r``: actors must not explore in step."""


def validate(config: Config) -> None:
    env_runner.validate(config)


def PORTS(config: Config) -> Ports:  # noqa: N802 - the name the pipeline looks for
    """The unroller's outputs and ``params``, the runner's ``metrics``; no ``policy``."""
    policy = unroller.PORTS(config)
    return Ports(publishes={**policy.publishes, "metrics": Port(Metrics, required=False)},
                 subscribes=policy.subscribes,
                 serves={"unroller_state": policy.serves["unroller_state"]})


class _Answer(NamedTuple):
    """What the runner reads from a reply: its ``message``."""

    message: ActionBatch


class _Request:
    """One env group's time step, as the unroller's ``act`` takes a served request."""

    __slots__ = ("message", "answer")

    def __init__(self, message, answer: asyncio.Future):
        self.message, self.answer = message, answer

    async def reply(self, actions: ActionBatch) -> None:
        if not self.answer.done():  # a group that stopped cancelled what it had asked
            self.answer.set_result(_Answer(actions))


# The longest an actor steps and acts without letting its event loop run its other tasks
# (heartbeats, stop and status requests, a coalescing publisher's release). A turn is forced
# only where the loop has not turned by itself in that time (a send waiting for credit turns
# it): a forced turn costs far more than its own time (64 CartPole envs,
# bench/pipeline_throughput.py --actor: ~8% slower with one every 50 ms, 2-5% every 0.25 s).
_LOOP_TURN_S = 0.25


class LocalPolicy:
    """The runner's policy calls, answered in this process by ``acting``.

    A time step sent waits until the runner waits for its actions; then every group's step
    that waits by then is acted on in one batch, as the unroller batches runners.
    ``wait`` returns None once the run stops."""

    def __init__(self, acting: unroller.Unroller, node):
        self.acting, self.node = acting, node
        self.waiting: list[_Request] = []
        self.one_at_a_time = asyncio.Lock()
        self.turned = time.perf_counter()  # when the event loop last ran its other tasks
        self.turn_noted = False  # _loop_turned is scheduled: it runs at the loop's next turn

    def send(self, msg, timeout: float):
        if self.node.stopping.is_set():
            return None
        answer = asyncio.get_running_loop().create_future()
        self.waiting.append(_Request(msg, answer))
        return answer

    async def wait(self, answer):
        if answer is None:
            return None
        # One act at a time, as the unroller node's loop does: the unroller's parameters and
        # unroll counts are its own, and two acts waiting for parameters would share one
        # subscription (one of them would never see the new version).
        async with self.one_at_a_time:
            # Done: acted on in the batch of a group that went first. Nothing waiting: that
            # batch was given up as the run stops.
            if not answer.done() and self.waiting:
                batch, self.waiting = self.waiting, []
                try:
                    await self.acting.act(batch)
                except TimeoutError as exc:  # no newer params: a failure, not a slow reply
                    raise RuntimeError(str(exc)) from None
                except unroller.Stopping:
                    return None
        if not self.turn_noted:
            self.turn_noted = True
            asyncio.get_running_loop().call_soon(self._loop_turned)
        elif time.perf_counter() - self.turned > _LOOP_TURN_S:
            # Acting and publishing complete without suspending while the replay store keeps
            # up, so the loop would never turn: no heartbeats, no stop request seen, and a
            # coalescing publisher would hold its messages until its batch is full.
            await asyncio.sleep(0)  # _loop_turned runs in this turn
        # Not answered: its batch was given up because the run is stopping.
        return answer.result() if answer.done() and not answer.cancelled() else None

    def _loop_turned(self) -> None:
        """Run by the event loop at its next turn, forced or not: when it last turned."""
        self.turned = time.perf_counter()
        self.turn_noted = False


async def run(config: Config, node, ready) -> dict:
    acting = unroller.Unroller(replace(config, seed=config.seed + 1000 * node.info.replica),
                               node)
    try:
        state_task = await unroller.start(acting, node)
    except unroller.Stopping:
        return {"steps": 0, "env_steps": acting.env_steps, "version": acting.version}
    discard_left_state(node, "unroller_state")
    try:
        summary = await env_runner.step_envs(config, node, LocalPolicy(acting, node), ready)
    finally:
        if state_task is not None:
            state_task.cancel()
    if not node.replaced:
        # The final checkpoint is taken once actors stopped (the graph's stop_after), so it
        # cannot ask: it takes this instead. The steps it counts go into replay as this
        # process exits (the node's last flush), before the checkpointer asks replay.
        leave_state(node, "unroller_state", "unroller", acting)
    return {**summary, "env_steps": acting.env_steps, "version": acting.version}
