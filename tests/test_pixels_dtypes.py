"""uint8 end to end, the env side: the stepper keeps the env's dtype and the env runner sends
each frame once, as uint8, to the policy service (checked on the receiving side of the wire).
MinAtar and Atari cases skip when their extra is not installed."""

from __future__ import annotations

import asyncio
import importlib.util

import gymnasium as gym
import numpy as np
import pytest

from algorithms.envs import make_env, minatar
from algorithms.steps import VectorEnvStepper
from nodes.messages import ActionBatch
from pipeline import graph as graphlib
from pipeline.inloop import run_graph

HAS_ALE = importlib.util.find_spec("ale_py") is not None


class _BoolImages(gym.Env):
    observation_space = gym.spaces.Box(0, 1, (2, 3, 3), bool)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.ones((2, 3, 3), bool), {}

    def step(self, action):
        return np.zeros((2, 3, 3), bool), 1.0, False, False, {}


class _Float64Vector(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (3,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(3), {}

    def step(self, action):
        return np.ones(3), 1.0, False, False, {}


gym.register("ConduitTest/BoolImages-v0", entry_point=_BoolImages)
gym.register("ConduitTest/Float64Vector-v0", entry_point=_Float64Vector)

CASES = [("CartPole-v1", np.float32, (4,)),
         ("ConduitTest/Float64Vector-v0", np.float32, (3,)),
         ("ConduitTest/BoolImages-v0", np.bool_, (2, 3, 3)),
         pytest.param("MinAtar/Breakout-v1", np.uint8, (4, 10, 10), marks=pytest.mark.skipif(
             not minatar.installed(), reason="needs the [minatar] extra")),
         pytest.param("ALE/Breakout-v5", np.uint8, (1, 84, 84), marks=pytest.mark.skipif(
             not HAS_ALE, reason="needs the [atari] extra"))]


@pytest.mark.parametrize("env_id,dtype,shape", CASES)
def test_stepper_keeps_images_uint8_and_vectors_float32(env_id, dtype, shape):
    env = make_env(env_id, 2, 0)
    try:
        stepper = VectorEnvStepper(env, 0)
        for ts in (stepper.reset(), stepper.step(np.zeros(2, np.int64))):
            assert ts.observation.dtype == dtype and ts.observation.shape == (2, *shape)
    finally:
        env.close()


async def policy_recorder(config, node, ready):
    """Serves ``policy`` with no-op actions and records what observations arrived."""
    server = node.bus.server("policy")
    ready()
    seen, steps = set(), 0
    while (request := await node.wait_or_stop(server.recv())) is not None:
        obs = request.message.time_step["observation"]
        seen.add(f"{obs.dtype}{list(obs.shape)}")
        steps += len(obs)
        await request.reply(ActionBatch(np.zeros(len(obs), np.int64), 0, steps))
    return {"observations": sorted(seen), "steps": steps}


GRAPH = """
name: pixels_hop
agent: {{env_id: "{env_id}", algorithm: {{name: random}}}}
nodes:
  env_runner:
    kind: env_runner
    config: {{num_envs: 2, max_steps: 40}}
    calls: [policy]
  policy:
    kind: "tests.test_pixels_dtypes:policy_recorder"
    serves: [policy]
run:
  stop_when: [env_runner]
  duration_s: 60
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("env_id,dtype,shape", CASES[2:])
def test_runner_sends_each_frame_once_in_its_dtype(tmp_path, env_id, dtype, shape):
    graph = graphlib.parse(GRAPH.format(env_id=env_id), "pixels_hop.yaml")
    summaries = asyncio.run(asyncio.wait_for(run_graph(graph, str(tmp_path)), 60))
    # One [num_envs, *frame] array per request in the env's byte dtype: no float copy, no
    # stacked frames.
    assert summaries["policy.0"]["observations"] == [f"{np.dtype(dtype)}{[2, *shape]}"]
    assert summaries["env_runner.0"]["steps"] == 40
