"""Graph-wide checks of the RL node kinds: settings that must agree across nodes.

Registered with :func:`pipeline.kinds.register_graph_check` when :mod:`nodes` is imported, so
``run.py run`` and ``run.py check`` reject these mistakes at load, one line with the key's
file:line, before any process starts.
"""

from __future__ import annotations

from pipeline.kinds import register_graph_check, register_progress
from pipeline.topics import RELIABLE
from typedconfig import ConfigError

# Kinds that step environments and number them from ``replica * num_envs``.
RUNNER_KINDS = ("env_runner", "actor")


def _nodes_of(graph, *kinds: str) -> list[str]:
    return [name for name, spec in graph.nodes.items() if spec.kind in kinds]


@register_graph_check
def environments_resolve(graph) -> None:
    """The agent's env id, and an evaluator's ``eval_env``, make an env here (an unknown id,
    a missing extra or a wrong ``env_kwargs`` key is one line at load, not a crash loop)."""
    from algorithms.envs import check_env_id

    checks = []
    if "agent" in graph.raw:
        agent = graph.raw["agent"]
        checks.append(("agent.env_id", agent.get("env_id"), agent.get("env_kwargs")))
    for name in _nodes_of(graph, "evaluator"):
        env = graph.configs[name].eval_env
        if env is not None:
            checks.append((f"nodes.{name}.config.eval_env.env_id", env.env_id, env.env_kwargs))
    for key, env_id, env_kwargs in checks:
        try:
            check_env_id(env_id, env_kwargs)
        except ValueError as exc:
            raise ConfigError(key, str(exc)) from None


@register_graph_check
def prioritized_agrees(graph) -> None:
    """A prioritized learner needs prioritized replay (importance weights, priorities to
    update), and prioritized replay needs a learner that sends priorities."""
    for name in _nodes_of(graph, "learner"):
        learner = graph.configs[name]
        if "sample" not in graph.nodes[name].calls:
            continue
        for store in _nodes_of(graph, "replay_store"):
            if "sample" not in graph.nodes[store].serves:
                continue
            replay = graph.configs[store].prioritized_sampling
            if learner.prioritized != replay:
                raise ConfigError(
                    f"nodes.{name}.config.prioritized",
                    f"is {str(learner.prioritized).lower()} but replay_store {store!r} has "
                    f"prioritized_sampling: {str(replay).lower()}; set both the same")


@register_graph_check
def runners_fit_replay(graph) -> None:
    """Replica ``r`` of an env runner numbers its envs from ``r * num_envs``: a replay store
    that takes their experience must have that many environments. Checked at load and, by the
    supervisor, before ``run.py scale`` starts a replica (a refusal changes nothing)."""
    runners = _nodes_of(graph, *RUNNER_KINDS)
    if not runners:
        return
    for store in _nodes_of(graph, "replay_store"):
        shards = graph.nodes[store].replicas if _sharded(graph, store) else 1
        # A shard holds the runners whose replica index is its own modulo the shard count.
        needed, widest = max((-(-graph.nodes[n].replicas // shards) * graph.configs[n].num_envs,
                              n) for n in runners)
        have = graph.configs[store].num_environments
        if have < needed:
            per = "" if shards == 1 else f" (per shard: {shards} shards)"
            raise ConfigError(
                f"nodes.{store}.config.num_environments",
                f"is {have}, but {graph.nodes[widest].replicas} replicas of {widest!r} with "
                f"num_envs {graph.configs[widest].num_envs} step {needed} environments{per}")


def _sharded(graph, store: str) -> bool:
    return any(graph.topics[t].partitioned for t in graph.nodes[store].subscribes)


@register_graph_check
def replay_shards_are_partitioned(graph) -> None:
    """A replay store with replicas is a set of shards: an environment's steps must all reach
    one shard (``experience`` partitioned: true; else n-step returns and episodes would be cut
    across shards), priority updates must reach the shard that holds the item, and every
    shard needs a runner of its own (a shard that never fills would stall the learner)."""
    runners = sum(graph.nodes[n].replicas for n in _nodes_of(graph, *RUNNER_KINDS))
    for store in _nodes_of(graph, "replay_store"):
        spec = graph.nodes[store]
        if spec.replicas == 1:
            continue
        for topic in spec.subscribes:
            if not graph.topics[topic].partitioned:
                raise ConfigError(
                    f"topics.{topic}", f"replay_store {store!r} has {spec.replicas} replicas "
                    f"(shards), so {topic!r} it subscribes to needs partitioned: true")
        if runners and runners < spec.replicas:
            raise ConfigError(
                f"nodes.{store}.replicas", f"is {spec.replicas} shards but the graph has "
                f"{runners} env runner(s): every shard needs at least one runner")


@register_graph_check
def just_in_time_knows_when_the_learner_starts_and_ends(graph) -> None:
    """A just-in-time unroller holds each unroll from the moment the learner took the last one
    (``max_queued_unrolls`` tells it) until shortly before the learner's batch ends (the
    ``eta_s`` a learner publishing between epochs sends); without either it would hold at the
    wrong moments or to each batch's end, at lock-step's pace with an asynchronous lag."""
    for name in _nodes_of(graph, "unroller"):
        config = graph.configs[name]
        if not config.just_in_time:
            continue
        key = f"nodes.{name}.config.just_in_time"
        if config.max_unrolls_per_version != 0 or config.max_queued_unrolls is None:
            raise ConfigError(key, "needs an asynchronous unroller that starts each unroll "
                              "once the learner took the last: max_unrolls_per_version: 0 "
                              "and max_queued_unrolls set (it is "
                              f"{config.max_unrolls_per_version} and "
                              f"{'null' if config.max_queued_unrolls is None else 'set'})")
        learners = _nodes_of(graph, "learner")
        if learners and not any(graph.configs[n].publish_between_epochs for n in learners):
            raise ConfigError(key, f"needs the learner's publish_between_epochs: true (learner "
                              f"{learners[0]!r} publishes only at a batch's end)")


@register_graph_check
def queued_unrolls_are_counted_on_a_reliable_topic(graph) -> None:
    """An unroller's ``max_queued_unrolls`` watches the queue of its trajectories topic, which
    only a reliable topic has (a lossy one drops what waits instead)."""
    for name in _nodes_of(graph, "unroller"):
        if graph.configs[name].max_queued_unrolls is None:
            continue
        for topic in graph.nodes[name].publishes:
            if graph.topics[topic].delivery != RELIABLE:
                raise ConfigError(
                    f"nodes.{name}.config.max_queued_unrolls", f"counts the unrolls queued on "
                    f"{topic!r}, which needs delivery: reliable (it is "
                    f"{graph.topics[topic].delivery})")


@register_graph_check
def checkpoints_hold_one_state_per_service(graph) -> None:
    """A checkpoint holds one state per component: a service served by several replicas would
    be saved from whichever answered and restored into all of them. Replay shards are the
    exception: each names its own component (``replay_store.<replica>``)."""
    for name in _nodes_of(graph, "checkpointer"):
        for service in graph.configs[name].services:
            for server, spec in graph.nodes.items():
                shards = spec.kind == "replay_store" and _sharded(graph, server)
                if service in spec.serves and spec.replicas > 1 and not shards:
                    raise ConfigError(
                        f"nodes.{name}.config.services",
                        f"asks {service!r}, served by {spec.replicas} replicas of {server!r}; "
                        f"a checkpoint holds one state per component: leave it out")


@register_graph_check
def learner_batches_can_be_filled(graph) -> None:
    """A sample request the replay store can never answer deadlocks the graph with every node
    healthy (the learner waits for its batch, the runners for actions): refused at load, at
    ``--set`` and at ``swap`` (the supervisor runs these checks on the swapped config).

    A request is ``mini_batch_size * batches_per_request`` items. It cannot exceed what the
    store holds (``num_environments * max_length``, per shard summed over shards), and with a
    samples-per-insert limit it cannot exceed ``2 * spi_tolerance``: inserts stop once the
    store is ``spi_tolerance`` ahead of sampling, and a sample may go at most
    ``spi_tolerance`` behind. ``min_size_to_sample`` above the capacity never lets sampling
    start. Offline stores (``datasets``) hold what their datasets hold: not checked here."""
    for store in _nodes_of(graph, "replay_store"):
        replay = graph.configs[store]
        if replay.datasets:
            continue
        shards = graph.nodes[store].replicas if _sharded(graph, store) else 1
        capacity = replay.num_environments * replay.max_length
        if replay.min_size_to_sample > capacity:
            raise ConfigError(
                f"nodes.{store}.config.min_size_to_sample",
                f"is {replay.min_size_to_sample}, above what the store holds "
                f"(num_environments {replay.num_environments} x max_length "
                f"{replay.max_length} = {capacity}): sampling would never start")
        for name in _nodes_of(graph, "learner"):
            spec = graph.nodes[name]
            if "sample" not in spec.calls or "sample" not in graph.nodes[store].serves:
                continue
            learner = graph.configs[name]
            size = learner.mini_batch_size * learner.batches_per_request
            what = (f"mini_batch_size {learner.mini_batch_size} x batches_per_request "
                    f"{learner.batches_per_request} = {size} items per sample request")
            key = f"nodes.{name}.config.mini_batch_size"
            if size > capacity * shards:
                raise ConfigError(key, f"{what}, more than replay_store {store!r} holds "
                                  f"({capacity * shards}: num_environments x max_length"
                                  f"{' x shards' if shards > 1 else ''}): it can never "
                                  f"be filled")
            if replay.samples_per_insert is not None and size > 2 * replay.spi_tolerance:
                raise ConfigError(key, f"{what}, more than replay_store {store!r}'s rate "
                                  f"limiter can ever allow (2 x spi_tolerance = "
                                  f"{2 * replay.spi_tolerance:g}): raise spi_tolerance or "
                                  f"lower the batch")


# What progress means for each RL kind, for the supervisor's progress watchdog
# (pipeline.liveness): numeric status values that grow while the node gets work done, added
# to the messages it moves on reliable topics. A learner's version and a runner's steps move
# even where no reliable topic does (an offline graph: a replay store of datasets, a learner).
PROGRESS = {"learner": ("version", "iteration"), "unroller": ("env_steps",),
            "env_runner": ("steps",), "replay_store": ("inserted", "sampled")}
for _kind, _keys in PROGRESS.items():
    register_progress(_kind, _keys)
