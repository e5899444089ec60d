"""Conduit's public API: the policy a run trained, without ZeroMQ or a running graph.

    from conduit import load_policy

    policy = load_policy("runs/dqn_cartpole/20261128-002634-189", which="best")
    env = policy.make_env()                      # or any env with the agent's observations
    obs, _ = env.reset(seed=0)
    action, state = policy.act(obs)              # an episode's first observation: no state
    while True:
        obs, reward, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
        action, state = policy.act(obs, state)   # then the state the last act returned

``which`` is ``"best"`` (the parameters of the evaluator's best evaluation, ``RUN_DIR/best/``),
``"reached"`` (those of the evaluation that met ``stop_at_return``, ``RUN_DIR/reached/``),
``"final"`` (the learner's parameters in the newest complete checkpoint) or a path (one of those
directories, a checkpoint directory, or a ``policy.pt``/``learner.pt``/``unroller.pt`` file).
The algorithm is the one the run trained: built from its ``graph.yaml``'s ``agent:`` section
with the data transformers (normalizer statistics, frame stacking) it acted with. See
``docs/policy.md`` for the files and ``run.py play`` / ``run.py export`` for the commands.
"""

from nodes._policy import (
    EXPORT_INFO,
    OneEnv,
    Policy,
    PolicyError,
    PolicyModule,
    load_exported,
    load_policy,
    read_agent,
)

__all__ = ["EXPORT_INFO", "OneEnv", "Policy", "PolicyError", "PolicyModule", "load_exported",
           "load_policy", "read_agent"]
