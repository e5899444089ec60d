"""Time to reach a reference task's threshold: Conduit's reference trainer vs Stable-Baselines3.

    python bench/learning.py ALGO ENV [--seed N] [--threads N] [--no-sb3]
    python bench/learning.py ALGO ENV --graph graphs/<graph>.yaml    # through the graph
    # --seed N with --graph: every node seed of the graph plus N (0: the graph as written)
    python bench/learning.py ALGO ENV --graph G --seeds 0,1,2    # one run per seed, median ratio

Both runs use the hyperparameters of ``algorithms.presets`` (mapped onto SB3's names), or for
MinAtar those of ``MINATAR_PRESETS`` below (a DQN graph's are checked against the preset), the
same algorithm (DQN with double Q, ours by default, is SB3's DQN with the Double-DQN target,
:func:`_double_dqn_class`; SB3's own ``DQN`` where ``double_q`` is false), the same env-step
budget, and the same greedy evaluation (10 episodes every ``eval_interval`` env steps,
evaluation time excluded from the clock). Each stops at the first evaluation that reaches the
threshold. The last line printed is one JSON object; ``ratio`` is ours / SB3 wall-clock seconds
to the threshold (null when either run did not reach it or SB3 has no counterpart).

With ``--graph``, both clocks start when a process is launched: the graph's at the launch of
``run.py`` (graph validation, imports, the fork server, every node's start-up included), SB3's at
the launch of a fresh Python process that imports SB3, builds the model and trains. Neither
clock counts the evaluation that reached the threshold: SB3's excludes every evaluation (they
stop its training), the graph's stops when the evaluated parameters reached the evaluator
(the evaluation's ``eval/seconds`` taken off the time its result arrived; the evaluator runs
beside training, so earlier evaluations are on the clock only as the CPU they took). SB3 then
evaluates as often as the graph's evaluator (its ``eval_interval``; the preset's otherwise), so
that neither side reaches the threshold sooner for being evaluated more often.

MinAtar (``python bench/learning.py dqn MinAtar/Breakout --graph graphs/dqn_minatar.yaml``; the
``-v1`` suffix may be left out): SB3 trains on the same environment class as the graph (uint8
``[C, 10, 10]`` frames, sticky actions 0.1), with the same network as a custom features extractor
(:class:`MinAtarCnn`: one 16x3x3 conv and ReLU, then SB3's 128-unit hidden layer and Q head),
double Q and 3-step returns, 2 gradient steps per vector step of 16 envs (the graph's one update
per 8 env steps) on mini-batches of 192 transitions (the graph's 64 windows of 4 steps train 3
transitions each: row t on its return to the window's end), the target copied every 4,000 env
steps (the graph's 500 updates).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from algorithms import configs  # noqa: E402
from algorithms.configs import DqnConfig  # noqa: E402
from algorithms.data import AlgStep, StepType  # noqa: E402
from algorithms.evaluation import evaluate  # noqa: E402
from algorithms.presets import Preset, get_preset, make_algorithm  # noqa: E402
from algorithms.sync_trainer import TrainerConfig, train  # noqa: E402
from nodes._checks import RUNNER_KINDS  # noqa: E402

# graphs/dqn_minatar.yaml's hyperparameters (``check_graph`` keeps the two the same).
MINATAR_PRESETS: dict[str, Preset] = {
    "dqn-MinAtar/Breakout-v1": Preset(
        "MinAtar/Breakout-v1", 1_000_000, 8.0,
        algorithm=DqnConfig(
            encoder="minatar_cnn", fc_layer_params=[128], learning_rate=3e-4, gamma=0.99,
            n_step=3, target_update_period=500, epsilon_greedy_start=1.0,
            rollout_epsilon_greedy=0.01, epsilon_decay_steps=100_000, td_error_loss_fn="huber"),
        trainer=dict(num_envs=16, unroll_length=1, initial_collect_steps=5000,
                     num_updates_per_train_iter=2, mini_batch_size=64,
                     replay_buffer_length=6250, eval_interval=25_000)),
}


def preset(algo: str, env: str) -> Preset:
    """``algorithms.presets``' task, or a MinAtar one; ``MinAtar/Breakout`` means ``-v1``."""
    for key in (f"{algo}-{env}", f"{algo}-{env}-v1"):
        if key in MINATAR_PRESETS:
            return MINATAR_PRESETS[key]
    return get_preset(algo, env)


def check_graph(graph: str, p: Preset) -> None:
    """Refuse a graph whose algorithm or rates differ from the preset SB3 gets: the comparison
    is only fair with the same hyperparameters on both sides."""
    from pipeline.graphyaml import read

    g, _ = read(Path(graph).read_text(), graph)
    nodes = g["nodes"]
    # The graph's one agent section, or (graphs written before it) the learner's config.
    block = g["agent"]["algorithm"] if "agent" in g else \
        nodes["learner"]["config"]["algorithm"]
    alg = configs.parse(block)
    if alg != p.algorithm:
        raise SystemExit(f"{graph}: algorithm {alg} differs from the bench preset "
                         f"{p.algorithm}")
    t = p.trainer
    runner = next(n["config"] for n in nodes.values() if n["kind"] in RUNNER_KINDS)
    store = nodes["replay_store"]["config"]
    learner = nodes["learner"]["config"]
    got = (runner["num_envs"], store["max_length"], store["min_size_to_sample"],
           learner["mini_batch_size"], store["samples_per_insert"])
    want_t = (t["num_envs"], t["replay_buffer_length"], t["initial_collect_steps"],
              t["mini_batch_size"],
              t["num_updates_per_train_iter"] * t["mini_batch_size"] // (t["unroll_length"]
                                                                         * t["num_envs"]))
    if got != want_t:
        raise SystemExit(f"{graph}: (num_envs, max_length, min_size_to_sample, "
                         f"mini_batch_size, samples_per_insert) {got} differ from the bench "
                         f"preset's {want_t}")


def run_ours(p: Preset, seed: int, threads: int) -> dict:
    alg = make_algorithm(p, seed)
    cfg = TrainerConfig.from_kwargs(**{**p.trainer, "num_env_steps": p.budget,
                                       "threshold": p.threshold, "stop_at_threshold": True,
                                       "num_threads": threads})
    r = train(alg, p.env_id, cfg, seed=seed,
              log=lambda s: print(f"[conduit] {s}", flush=True))
    return {"reached": r.reached_at_steps is not None, "env_steps": r.reached_at_steps,
            "seconds": r.reached_at_seconds, "best_return": r.best_return,
            "total_env_steps": r.env_steps, "total_seconds": round(r.train_seconds, 2)}


def _evaluated_at(m: dict) -> float:
    """When the evaluated parameters reached the evaluator: the result's arrival less the
    evaluation's own duration."""
    return m["time"] - m.get("eval/seconds", 0.0)


def run_graph(graph: str, p: Preset, threads: int, seed: int = 0) -> dict:
    """Train through the multi-process graph (``python run.py GRAPH``), stopping at the first
    evaluation that reaches the threshold. Seconds run from the launch of ``run.py`` to that
    evaluation (the evaluator works in its own process, so no time is left out). ``seed`` is
    added to every node's seed (``run.py run --seed``)."""
    import tempfile

    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = str(Path(tmp) / "run")
        cmd = [sys.executable, str(root / "run.py"), "run", graph, "--run-dir", run_dir,
               "--quiet", "--set", f"nodes.evaluator.config.stop_at_return={p.threshold}",
               "--set", f"nodes.learner.config.num_threads={threads}"]
        cmd += ["--seed", str(seed)]
        t0 = time.time()
        code = subprocess.run(cmd, cwd=root).returncode
        wall = time.time() - t0
        with open(Path(run_dir) / "metrics.jsonl") as f:
            evals = [m for m in map(json.loads, f) if "eval/return" in m]
    for m in evals:
        print(f"[graph] steps={m['env_steps']} time={_evaluated_at(m) - t0:.1f}s "
              f"eval={m['eval/return']:.1f} (evaluation {m.get('eval/seconds', 0):.2f}s)",
              flush=True)
    hit = next((m for m in evals if m["eval/return"] >= p.threshold
                and m["env_steps"] <= p.budget), None)
    return {"reached": hit is not None, "env_steps": hit and hit["env_steps"],
            "seconds": hit and round(_evaluated_at(hit) - t0, 2),
            "eval_seconds": hit and round(hit.get("eval/seconds", 0.0), 2), "exit_code": code,
            "best_return": max((m["eval/return"] for m in evals), default=float("-inf")),
            "total_seconds": round(wall, 2)}


class _Sb3Policy:
    """Adapter so ``algorithms.evaluation.evaluate`` can run an SB3 model greedily; a
    recurrent one (sb3-contrib's ``RecurrentPPO``) with its LSTM states carried per env and
    reset where an episode starts."""

    def __init__(self, model):
        self.model = model
        self.recurrent = type(model).__name__ == "RecurrentPPO"

    def get_initial_state(self, batch_size):
        return ()

    def predict_step(self, time_step, state=()):
        obs = np.asarray(time_step.observation)
        if not self.recurrent:
            action, _ = self.model.predict(obs, deterministic=True)
            return AlgStep(output=action, state=state)
        starts = np.asarray(time_step.step_type) == StepType.FIRST
        action, state = self.model.predict(obs, state=state or None, episode_start=starts,
                                           deterministic=True)
        return AlgStep(output=action, state=state)


class _MinAtarGym:
    """One game of the graph's MinAtar env class as a Gymnasium env, for SB3's vector env."""

    def __new__(cls, env_id: str):
        import gymnasium as gym

        from algorithms.envs import make_env

        class Env(gym.Env):
            def __init__(self):
                self.inner = make_env(env_id, 1, training=True)
                self.observation_space = self.inner.single_observation_space
                self.action_space = self.inner.single_action_space

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                obs, _ = self.inner.reset(seed=seed)
                return obs[0], {}

            def step(self, action):
                obs, r, term, trunc, _ = self.inner.step(np.asarray([action]))
                return obs[0], float(r[0]), bool(term[0]), bool(trunc[0]), {}

        return Env()


def _minatar_cnn_extractor():
    """SB3 features extractor with the graph's ``minatar_cnn`` encoder: conv 16x3/1 and ReLU
    on the frames scaled to [0, 1] (SB3 scales uint8 images itself), flattened."""
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class MinAtarCnn(BaseFeaturesExtractor):
        def __init__(self, observation_space):
            c, h, w = observation_space.shape
            super().__init__(observation_space, features_dim=16 * (h - 2) * (w - 2))
            self.net = torch.nn.Sequential(torch.nn.Conv2d(c, 16, 3, 1), torch.nn.ReLU(),
                                           torch.nn.Flatten())

        def forward(self, obs):
            return self.net(obs)

    return MinAtarCnn


def _double_dqn_class():
    """SB3's DQN with the Double-DQN target (the online network picks the next action), as
    the graph's ``double_q: true``; everything else is SB3's ``train``."""
    import torch.nn.functional as F
    from stable_baselines3 import DQN

    class DoubleDQN(DQN):
        def train(self, gradient_steps: int, batch_size: int = 100) -> None:
            self.policy.set_training_mode(True)
            self._update_learning_rate(self.policy.optimizer)
            for _ in range(gradient_steps):
                data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
                discounts = data.discounts if data.discounts is not None else self.gamma
                with torch.no_grad():
                    a_star = self.q_net(data.next_observations).argmax(1, keepdim=True)
                    next_q = self.q_net_target(data.next_observations).gather(1, a_star)
                    target = data.rewards + (1 - data.dones) * discounts * next_q
                q = self.q_net(data.observations).gather(1, data.actions.long())
                loss = F.smooth_l1_loss(q, target)
                self.policy.optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                self.policy.optimizer.step()
            self._n_updates += gradient_steps

    return DoubleDQN


def _sb3_model(p: Preset, env, seed: int):
    import stable_baselines3 as sb3
    from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise

    a, t = configs.to_dict(p.algorithm), p.trainer
    n = t.get("num_envs", 1)
    common = dict(seed=seed, device="cpu", verbose=0)
    # The same algorithm on both sides: SB3's DQN has no double Q; where ours has it (the
    # algorithm's default), SB3 gets it too.
    dqn_class = (_double_dqn_class() if a.get("double_q", True) else sb3.DQN) \
        if p.algo == "dqn" else None
    if p.algo == "dqn" and a.get("encoder") == "minatar_cnn":
        return dqn_class(
            "CnnPolicy", env, learning_rate=a["learning_rate"], gamma=a["gamma"],
            n_steps=a["n_step"], buffer_size=t["replay_buffer_length"] * n,
            learning_starts=t["initial_collect_steps"],
            # Each of our windows trains its n_step rows (row t on the return to the window's
            # end), so a mini-batch of 64 windows is 192 trained transitions: SB3 gets the same.
            batch_size=t["mini_batch_size"] * a["n_step"],
            tau=1.0, train_freq=t["unroll_length"],
            gradient_steps=t["num_updates_per_train_iter"],
            target_update_interval=a["target_update_period"] * t["unroll_length"] * n
            // t["num_updates_per_train_iter"],
            exploration_fraction=a["epsilon_decay_steps"] / p.budget,
            exploration_initial_eps=a["epsilon_greedy_start"],
            exploration_final_eps=a["rollout_epsilon_greedy"], max_grad_norm=10.0,
            policy_kwargs=dict(net_arch=list(a["fc_layer_params"]),
                               features_extractor_class=_minatar_cnn_extractor()),
            **common)
    if p.algo == "dqn":
        return dqn_class(
            "MlpPolicy", env, learning_rate=a["learning_rate"], gamma=a["gamma"],
            buffer_size=t["replay_buffer_length"] * n, learning_starts=t["initial_collect_steps"],
            batch_size=t["mini_batch_size"], tau=1.0, train_freq=t["unroll_length"],
            gradient_steps=t["num_updates_per_train_iter"],
            # our target period counts gradient steps; SB3's counts env steps
            target_update_interval=a["target_update_period"] * t["unroll_length"] * n
            // t["num_updates_per_train_iter"],
            exploration_fraction=a["epsilon_decay_steps"] / p.budget,
            exploration_final_eps=a["rollout_epsilon_greedy"], max_grad_norm=10.0,
            policy_kwargs=dict(net_arch=list(a["fc_layer_params"])), **common)
    if p.algo == "sac":
        if p.env_id == "CartPole-v1":
            return None  # SB3's SAC has no discrete-action version
        return sb3.SAC(
            "MlpPolicy", env, learning_rate=a["actor_learning_rate"], gamma=a["gamma"],
            buffer_size=t["replay_buffer_length"] * n, learning_starts=t["initial_collect_steps"],
            batch_size=t["mini_batch_size"], tau=a["target_update_tau"], train_freq=1,
            gradient_steps=t["num_updates_per_train_iter"], ent_coef="auto",
            policy_kwargs=dict(net_arch=list(a["actor_fc_layer_params"])), **common)
    if p.algo in ("td3", "ddpg"):
        dim = env.action_space.shape[0]
        if a.get("exploration_noise", "ou") == "gaussian":
            noise = NormalActionNoise(np.zeros(dim), a["ou_stddev"] * np.ones(dim))
        else:  # our OU step is x += -damping * x + stddev * N(0, 1), i.e. dt = 1
            noise = OrnsteinUhlenbeckActionNoise(np.zeros(dim), a["ou_stddev"] * np.ones(dim),
                                                 theta=a["ou_damping"], dt=1.0)
        kw = dict(learning_rate=a["actor_learning_rate"], gamma=a["gamma"],
                  buffer_size=t["replay_buffer_length"] * n,
                  learning_starts=t["initial_collect_steps"], batch_size=t["mini_batch_size"],
                  tau=a["target_update_tau"], train_freq=1,
                  gradient_steps=t["num_updates_per_train_iter"], action_noise=noise,
                  policy_kwargs=dict(net_arch=list(a["actor_fc_layer_params"])), **common)
        if p.algo == "td3":
            return sb3.TD3("MlpPolicy", env, policy_delay=2, target_policy_noise=0.2,
                           target_noise_clip=0.5, **kw)
        return sb3.DDPG("MlpPolicy", env, **kw)
    net = dict(pi=list(a["actor_fc_layer_params"]), vf=list(a["value_fc_layer_params"]))
    if p.algo == "ppo" and a.get("rnn_size"):
        return _recurrent_ppo(p, env, net, common)
    if p.algo == "ppo":
        return sb3.PPO(
            "MlpPolicy", env, learning_rate=a["learning_rate"], n_steps=t["unroll_length"],
            batch_size=a["mini_batch_size"], n_epochs=a["num_epochs"], gamma=a["gamma"],
            gae_lambda=a["td_lambda"], clip_range=a["importance_ratio_clipping"],
            ent_coef=a["entropy_regularization"], vf_coef=a["td_loss_weight"],
            max_grad_norm=0.5, policy_kwargs=dict(net_arch=net), **common)
    if p.algo == "a2c":
        return sb3.A2C(
            "MlpPolicy", env, learning_rate=a["learning_rate"], n_steps=t["unroll_length"],
            gamma=a["gamma"], gae_lambda=a["td_lambda"] if a.get("use_gae") else 1.0,
            ent_coef=a["entropy_regularization"], vf_coef=a["td_loss_weight"],
            max_grad_norm=0.5, normalize_advantage=a.get("normalize_advantages", False),
            use_rms_prop=False, policy_kwargs=dict(net_arch=net), **common)
    raise ValueError(p.algo)


def _recurrent_ppo(p: Preset, env, net: dict, common: dict):
    """sb3-contrib's RecurrentPPO with RL Zoo's policy for CartPoleNoVel-v1: LSTM cells of
    ``rnn_size`` for the actor and (``enable_critic_lstm``) the critic straight after the
    observation, ReLU heads, no orthogonal init; our learning-rate decay over
    ``learning_rate_anneal_steps`` as a schedule over SB3's budget."""
    from sb3_contrib import RecurrentPPO
    from torch import nn

    a, t = configs.to_dict(p.algorithm), p.trainer
    lr, anneal = a["learning_rate"], a.get("learning_rate_anneal_steps")
    schedule = (lambda left: lr * max(0.0, 1.0 - (1.0 - left) * p.budget / anneal)) \
        if anneal else lr
    return RecurrentPPO(
        "MlpLstmPolicy", env, learning_rate=schedule, n_steps=t["unroll_length"],
        batch_size=a["mini_batch_size"], n_epochs=a["num_epochs"], gamma=a["gamma"],
        gae_lambda=a["td_lambda"], clip_range=a["importance_ratio_clipping"],
        ent_coef=a["entropy_regularization"], vf_coef=a["td_loss_weight"], max_grad_norm=0.5,
        policy_kwargs=dict(ortho_init=False, activation_fn=nn.ReLU,
                           lstm_hidden_size=a["rnn_size"], enable_critic_lstm=True,
                           net_arch=net), **common)


def run_sb3_process(algo: str, env: str, seed: int, threads: int,
                    eval_interval: int | None = None) -> dict | None:
    """SB3 in a fresh process, its clock started at the launch (see the module docstring)."""
    cmd = [sys.executable, __file__, algo, env, "--seed", str(seed), "--threads", str(threads),
           "--sb3-launched-at", repr(time.time())]
    if eval_interval:
        cmd += ["--sb3-eval-interval", str(eval_interval)]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    lines = out.strip().splitlines()
    for line in lines[:-1]:
        print(line, flush=True)
    return json.loads(lines[-1])


def run_sb3(p: Preset, seed: int, threads: int, launched_at: float | None = None,
            eval_interval: int | None = None) -> dict | None:
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    import algorithms.envs  # noqa: F401  (registers CartPoleNoVelocity-v1 with Gymnasium)

    torch.set_num_threads(threads)
    n = p.trainer.get("num_envs", 1)
    env_id = (lambda: _MinAtarGym(p.env_id)) if p.env_id.startswith("MinAtar/") else p.env_id
    env = make_vec_env(env_id, n_envs=n, seed=seed)
    model = _sb3_model(p, env, seed)
    if model is None:
        return None
    interval = eval_interval or p.trainer.get("eval_interval", 5000)
    state = {"next": interval, "eval_time": 0.0, "evals": [], "reached": None}
    # perf_counter has no epoch: shift the launch time into its frame.
    t_start = time.perf_counter() - (time.time() - launched_at if launched_at else 0.0)

    class EvalCallback(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps < state["next"]:
                return True
            state["next"] += interval
            t0 = time.perf_counter()
            ret = evaluate(_Sb3Policy(self.model), p.env_id, 10, seed=10_000 + seed).mean_return
            state["eval_time"] += time.perf_counter() - t0
            elapsed = time.perf_counter() - t_start - state["eval_time"]
            state["evals"].append((self.num_timesteps, elapsed, ret))
            print(f"[sb3] steps={self.num_timesteps} time={elapsed:.1f}s eval={ret:.1f}",
                  flush=True)
            if ret >= p.threshold:
                state["reached"] = (self.num_timesteps, elapsed)
                return False
            return True

    model.learn(total_timesteps=p.budget, callback=EvalCallback())
    total = time.perf_counter() - t_start - state["eval_time"]
    env.close()
    reached = state["reached"]
    return {"reached": reached is not None, "env_steps": reached and reached[0],
            "seconds": reached and round(reached[1], 2),
            "best_return": max((e[2] for e in state["evals"]), default=None),
            "total_env_steps": model.num_timesteps, "total_seconds": round(total, 2)}


@functools.cache
def _node_configs(graph: str) -> dict:
    """Each node of ``graph`` and its built config, the graph loaded once."""
    import nodes  # noqa: F401  (registers the node kinds the graph names)
    from pipeline.graph import load

    return load(graph).configs


def graph_eval_interval(graph: str) -> int | None:
    """How often the graph's evaluator evaluates (env steps): SB3 then evaluates as often, so
    neither side sees the threshold sooner for being looked at more often."""
    return next((config.eval_interval for config in _node_configs(graph).values()
                 if isinstance(getattr(config, "eval_interval", None), int)), None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("algo")
    ap.add_argument("env")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", help="comma-separated seeds run one after another (both sides "
                    "per seed); ends with the median ratio, the issue's figure")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of the trainer: SB3's, ours in-process, or the graph's "
                         "learner (the same number on both sides)")
    ap.add_argument("--no-sb3", action="store_true")
    ap.add_argument("--graph", help="train through this graph (run.py) instead of the "
                    "single-process reference trainer")
    ap.add_argument("--sb3-launched-at", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--sb3-eval-interval", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    p = preset(args.algo, args.env)
    if args.graph and p.algo == "dqn":
        check_graph(args.graph, p)
    if args.sb3_launched_at is not None:  # the SB3 side of --graph, in its own process
        print(json.dumps(run_sb3(p, args.seed, args.threads, args.sb3_launched_at,
                                 args.sb3_eval_interval)))
        return 0
    if args.seeds:
        return run_seeds(args, argv or sys.argv[1:])
    print(f"task {args.algo} {args.env}: threshold {p.threshold} within {p.budget} env steps")
    ours = run_graph(args.graph, p, args.threads, args.seed) if args.graph else \
        run_ours(p, args.seed, args.threads)
    print(f"conduit: reached={ours['reached']} env_steps={ours['env_steps']} "
          f"seconds={ours['seconds']} best_return={ours['best_return']:.1f}")
    if args.no_sb3:
        sb3 = None
    elif args.graph:
        sb3 = run_sb3_process(args.algo, args.env, args.seed, args.threads,
                              graph_eval_interval(args.graph))
    else:
        sb3 = run_sb3(p, args.seed, args.threads)
    if sb3 is not None:
        print(f"sb3: reached={sb3['reached']} env_steps={sb3['env_steps']} "
              f"seconds={sb3['seconds']} best_return={sb3['best_return']}")
    ratio = None
    if sb3 and ours["reached"] and sb3["reached"]:
        ratio = round(ours["seconds"] / max(sb3["seconds"], 1e-9), 3)
    print(json.dumps({"algo": args.algo, "env": args.env, "seed": args.seed,
                      "mode": "graph" if args.graph else "in-process",
                      "threshold": p.threshold, "budget": p.budget, "conduit": ours,
                      "sb3": sb3, "ratio": ratio}))
    return 0


def run_seeds(args, argv: list[str]) -> int:
    """Each seed in a fresh ``bench/learning.py --seed N`` process (so no run inherits another's
    warm caches or imports), then the median of the ratios: a run that missed the threshold
    counts as an infinite ratio, so it can only raise the median."""
    seeds = [int(s) for s in args.seeds.split(",")]
    rest = without_option(argv, "--seeds")
    results = []
    for seed in seeds:
        out = subprocess.run([sys.executable, __file__, *rest, "--seed", str(seed)],
                             capture_output=True, text=True)
        if out.returncode != 0 or not out.stdout.strip():
            print(out.stdout + out.stderr, file=sys.stderr)
            return 1
        line = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(line)
        c, b = line["conduit"], line["sb3"] or {}
        print(f"seed {seed}: conduit {c['env_steps']} env steps {c['seconds']} s, "
              f"sb3 {b.get('env_steps')} env steps {b.get('seconds')} s, ratio {line['ratio']}",
              flush=True)
    ratios = [r["ratio"] for r in results]
    print(json.dumps({"algo": args.algo, "env": args.env, "seeds": seeds, "ratios": ratios,
                      "median_ratio": median_ratio(ratios)}))
    return 0


def without_option(argv: list[str], option: str) -> list[str]:
    """``argv`` without ``option`` and its value (``--opt X`` or ``--opt=X``)."""
    out, skip = [], False
    for a in argv:
        if skip or a.startswith(option + "="):
            skip = False
            continue
        skip = a == option
        if not skip:
            out.append(a)
    return out


def median_ratio(ratios: list[float | None]) -> float | None:
    """The median, a missing ratio (a run that did not reach the threshold) counting as
    infinite: it can only raise the median; None when the median itself is such a run."""
    median = statistics.median(math.inf if r is None else r for r in ratios)
    return None if math.isinf(median) else median


if __name__ == "__main__":
    raise SystemExit(main())
