"""The replay store's hindsight relabeling (:mod:`storage.her`) from its config: the checks
at graph load and the relabeler the store applies to each sampled batch.

HER needs a goal-conditioned env: a ``Dict`` observation whose ``her_achieved_goal`` and
``her_desired_goal`` keys have one shape. That is checked against the agent's env when the
graph loads (one line naming the key; the graph adds the node and file:line), not found out
by a store that crashes at its first sample.
"""

from __future__ import annotations

from storage.her import STRATEGIES, HindsightRelabeler, distance_reward, import_reward
from typedconfig import ConfigError

OBSERVATION = "observation."


def enabled(config) -> bool:
    return config.her_relabel_ratio > 0.0


def validate_her(config) -> None:
    """Raise ``ConfigError(key, message)`` for a HER setting that cannot work."""
    if not 0.0 <= config.her_relabel_ratio <= 1.0:
        raise ConfigError("her_relabel_ratio",
                          f"must lie in [0, 1], got {config.her_relabel_ratio}")
    if config.her_strategy not in STRATEGIES:
        raise ConfigError("her_strategy", f"must be one of {', '.join(STRATEGIES)}, got "
                                          f"{config.her_strategy!r}")
    if not enabled(config):
        return
    if config.her_reward is not None:
        try:
            import_reward(config.her_reward)
        except ValueError as exc:
            raise ConfigError("her_reward", str(exc)) from None
    if config.datasets:
        raise ConfigError("her_relabel_ratio", "is not supported with datasets (their rows "
                                               "carry no episode index)")
    if config.agent is None:
        return
    _check_goal_conditioned(config)


def _check_goal_conditioned(config) -> None:
    """The agent's env has a Dict observation with both goal keys, of one shape."""
    import gymnasium as gym

    from algorithms.envs import env_spaces

    agent = config.agent
    try:
        space, _ = env_spaces(agent.env_id, agent.env_kwargs)
    except ValueError:  # an env id that is not one: the agent's own check names it
        return
    if not isinstance(space, gym.spaces.Dict):
        raise ConfigError("her_relabel_ratio", f"needs a goal-conditioned env (a Dict "
                          f"observation with {config.her_achieved_goal} and "
                          f"{config.her_desired_goal}); {agent.env_id}'s observation is "
                          f"{type(space).__name__}{list(space.shape or ())}")
    for key in ("her_achieved_goal", "her_desired_goal"):
        name = getattr(config, key)
        if name not in space.spaces:
            raise ConfigError(key, f"{agent.env_id}'s observation has no key {name!r} "
                                   f"(keys: {', '.join(space.spaces)})")
    achieved = space.spaces[config.her_achieved_goal].shape
    desired = space.spaces[config.her_desired_goal].shape
    if achieved != desired:
        raise ConfigError("her_desired_goal", f"{config.her_desired_goal} has shape "
                          f"{list(desired)} but {config.her_achieved_goal} {list(achieved)}: "
                          f"an achieved goal cannot stand for a desired one")


def make_relabeler(config) -> HindsightRelabeler | None:
    """The store's relabeler, None when ``her_relabel_ratio`` is 0."""
    if not enabled(config):
        return None
    reward = (import_reward(config.her_reward) if config.her_reward is not None
              else distance_reward(config.her_distance_threshold))
    return HindsightRelabeler(
        config.her_relabel_ratio, config.her_strategy,
        achieved_field=OBSERVATION + config.her_achieved_goal,
        desired_field=OBSERVATION + config.her_desired_goal,
        reward_fn=reward, seed=config.seed + 1)
