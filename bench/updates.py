"""Time of one gradient update on the same batch: Conduit vs Stable-Baselines3 vs a plain
PyTorch update written the way CleanRL writes its single-file agents.

    python bench/updates.py                      # dqn, sac, ppo; 1 and 2 threads (~1 min)
    python bench/updates.py --algos sac --threads 1 --updates 500

Why: the reference tasks are update-bound (SAC Pendulum does one update per env step), so
wall-clock to the threshold follows the cost of one update. Each side trains on one batch of
real transitions (a random policy on the preset's env, the preset's batch size), fed to it
directly so that no side's replay sampling is timed:

* *ours*: ``alg.train_on(batch)`` (loss, backward, optimizer step, target update, priorities
  read back), with the preset's hyperparameters (DQN without its double-Q target, which the
  peers do not have: the preset's costs one more forward pass, ~0.15 ms here);
* *ours bf16*: the same with ``precision: bfloat16`` (mixed precision: the hidden layers'
  products in bfloat16; see ``RLAlgorithm.training_precision``);
* *ours through autograd* (DQN): ours with its update without autograd switched off
  (``algorithms/mlp_backprop.py``; the same update up to float rounding);
* *ours bf16 parallel* (SAC): also with ``parallel_update`` (the actor's and the critics'
  halves of the update on two threads, each at N torch threads: it uses a second core);
* *SB3*: ``model.train(gradient_steps=n)`` of the model ``bench/learning.py`` builds, its
  replay buffer's ``sample`` returning the batch (PPO: ``train()`` over a full rollout buffer,
  ``n_epochs`` passes of one mini-batch, divided by ``n_epochs``);
* *plain*: ``nn.Sequential`` networks, ``torch.optim.Adam`` and the textbook loss, as a CleanRL
  script's update (SAC: one critic, one actor and one temperature step per update).

The figure is milliseconds of wall-clock per update (PPO: per epoch of one 256-sample
mini-batch), median of ``--repeats`` blocks of ``--updates`` updates after a warm-up, with
``torch.set_num_threads(N)`` on every side. The ratio is ours / peer: below 1 is faster.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from algorithms import configs  # noqa: E402
from algorithms.data import Experience  # noqa: E402
from algorithms.presets import get_preset, make_algorithm  # noqa: E402
from algorithms.sync_trainer import (  # noqa: E402
    TinyReplay,
    _numpy_experience,
    stack_experience,
)

TASKS = {"dqn": "CartPole-v1", "sac": "Pendulum-v1", "ppo": "CartPole-v1"}


def collect(alg, env_id: str, num_envs: int, steps: int, seed: int = 0) -> list[Experience]:
    """``steps`` rows ``[num_envs]`` of real experience from the algorithm's rollout policy
    (random actions for the off-policy presets' first steps)."""
    from algorithms.steps import VectorEnvStepper, make_vector_env

    env = make_vector_env(env_id, num_envs, seed, training=True)
    stepper = VectorEnvStepper(env, seed)
    ts = stepper.reset()
    rows = []
    with torch.no_grad():
        for _ in range(steps):
            step = alg.rollout_step(ts)
            cur = _numpy_experience(ts, step)
            rows.append(cur)
            ts = stepper.step(cur.action)
    env.close()
    return rows


def timed(update, updates: int, repeats: int, warmup: int) -> float:
    """Median milliseconds per call of ``update()`` over ``repeats`` blocks."""
    for _ in range(warmup):
        update()
    blocks = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(updates):
            update()
        blocks.append((time.perf_counter() - t) / updates * 1e3)
    return statistics.median(blocks)


# ----- the batches -------------------------------------------------------------------------------
def replay_batch(p, alg) -> Experience:
    """The preset's mini-batch of ``[B, 2]`` windows, from a random policy's transitions."""
    n = p.trainer.get("num_envs", 1)
    rows = collect(alg, p.env_id, n, max(2000 // n, 64))
    replay = TinyReplay(len(rows), n, np.random.default_rng(0))
    for row in rows:
        replay.add(row)
    return replay.sample(p.trainer["mini_batch_size"], 2)


def sb3_replay_samples(batch: Experience, discrete: bool):
    """The same transitions as SB3's ``ReplayBufferSamples`` (row 0 -> row 1 of each window)."""
    from stable_baselines3.common.type_aliases import ReplayBufferSamples

    t = lambda x: torch.as_tensor(np.asarray(x))  # noqa: E731
    act = t(batch.action[:, 0])
    act = act.long().view(-1, 1) if discrete else act.float().view(len(act), -1)
    done = (np.asarray(batch.discount[:, 1]) == 0).astype(np.float32)
    return ReplayBufferSamples(
        observations=t(batch.observation[:, 0]).float(), actions=act,
        next_observations=t(batch.observation[:, 1]).float(),
        dones=t(done).view(-1, 1), rewards=t(batch.reward[:, 1]).float().view(-1, 1))


# ----- plain PyTorch updates (CleanRL's way of writing them) ------------------------------------
def mlp(n_in: int, hidden, n_out: int, act=nn.ReLU) -> nn.Sequential:
    layers, size = [], n_in
    for h in hidden:
        layers += [nn.Linear(size, h), act()]
        size = h
    return nn.Sequential(*layers, nn.Linear(size, n_out))


def plain_dqn(p, s):
    a = configs.to_dict(p.algorithm)
    q = mlp(s.observations.shape[1], a["fc_layer_params"], 2)
    target = mlp(s.observations.shape[1], a["fc_layer_params"], 2)
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=a["learning_rate"])
    gamma = a["gamma"]

    def update():
        with torch.no_grad():
            target_max = target(s.next_observations).max(1).values
            td_target = s.rewards.flatten() + gamma * target_max * (1 - s.dones.flatten())
        old = q(s.observations).gather(1, s.actions).squeeze(1)
        loss = F.smooth_l1_loss(old, td_target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    return update


def plain_sac(p, s):
    a = configs.to_dict(p.algorithm)
    obs_dim, act_dim = s.observations.shape[1], s.actions.shape[1]
    hid = a["critic_fc_layer_params"]
    qf1, qf2 = mlp(obs_dim + act_dim, hid, 1), mlp(obs_dim + act_dim, hid, 1)
    qf1_t, qf2_t = mlp(obs_dim + act_dim, hid, 1), mlp(obs_dim + act_dim, hid, 1)
    qf1_t.load_state_dict(qf1.state_dict())
    qf2_t.load_state_dict(qf2.state_dict())
    trunk = mlp(obs_dim, a["actor_fc_layer_params"][:-1], a["actor_fc_layer_params"][-1])
    actor = nn.Sequential(trunk, nn.ReLU(), nn.Linear(a["actor_fc_layer_params"][-1], 2 * act_dim))
    q_opt = torch.optim.Adam([*qf1.parameters(), *qf2.parameters()], lr=a["critic_learning_rate"])
    pi_opt = torch.optim.Adam(actor.parameters(), lr=a["actor_learning_rate"])
    log_alpha = torch.zeros(1, requires_grad=True)
    a_opt = torch.optim.Adam([log_alpha], lr=a["alpha_learning_rate"])
    gamma, tau, target_entropy = a["gamma"], a["target_update_tau"], -float(act_dim)

    def act(obs):
        mean, log_std = actor(obs).chunk(2, -1)
        std = log_std.clamp(-5, 2).exp()
        normal = torch.distributions.Normal(mean, std, validate_args=False)
        u = normal.rsample()
        y = torch.tanh(u)
        log_prob = normal.log_prob(u) - torch.log(1 - y.pow(2) + 1e-6)
        return 2.0 * y, log_prob.sum(1, keepdim=True)

    def update():
        alpha = log_alpha.exp().item()
        with torch.no_grad():
            next_a, next_logp = act(s.next_observations)
            x = torch.cat([s.next_observations, next_a], 1)
            min_q = torch.min(qf1_t(x), qf2_t(x)) - alpha * next_logp
            target = s.rewards + (1 - s.dones) * gamma * min_q
        x = torch.cat([s.observations, s.actions], 1)
        q_loss = F.mse_loss(qf1(x), target) + F.mse_loss(qf2(x), target)
        q_opt.zero_grad()
        q_loss.backward()
        q_opt.step()
        pi, logp = act(s.observations)
        x = torch.cat([s.observations, pi], 1)
        pi_loss = (alpha * logp - torch.min(qf1(x), qf2(x))).mean()
        pi_opt.zero_grad()
        pi_loss.backward()
        pi_opt.step()
        with torch.no_grad():
            _, logp = act(s.observations)
        alpha_loss = (-log_alpha.exp() * (logp + target_entropy)).mean()
        a_opt.zero_grad()
        alpha_loss.backward()
        a_opt.step()
        with torch.no_grad():
            for net, tgt in ((qf1, qf1_t), (qf2, qf2_t)):
                for w, wt in zip(net.parameters(), tgt.parameters(), strict=True):
                    wt.lerp_(w, tau)
        return q_loss.item()
    return update


def plain_ppo(p, mb: dict):
    a = configs.to_dict(p.algorithm)
    obs_dim = mb["obs"].shape[1]
    actor = mlp(obs_dim, a["actor_fc_layer_params"], 2, nn.Tanh)
    critic = mlp(obs_dim, a["value_fc_layer_params"], 1, nn.Tanh)
    opt = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=a["learning_rate"],
                           eps=1e-5)
    clip = a["importance_ratio_clipping"]

    def update():
        dist = torch.distributions.Categorical(logits=actor(mb["obs"]), validate_args=False)
        logp = dist.log_prob(mb["actions"])
        ratio = (logp - mb["logp"]).exp()
        adv = mb["adv"]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
        v_loss = 0.5 * (critic(mb["obs"]).squeeze(1) - mb["returns"]).pow(2).mean()
        loss = pg + a["td_loss_weight"] * v_loss - a["entropy_regularization"] * dist.entropy().mean()
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_([*actor.parameters(), *critic.parameters()], 0.5)
        opt.step()
        return loss.item()
    return update


# ----- the three sides per algorithm -----------------------------------------------------------
def off_policy_sides(algo: str, env_id: str):
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger

    from bench.learning import _sb3_model

    p = get_preset(algo, env_id)
    if algo == "dqn":  # SB3's DQN and the plain one have no double-Q target: nor does ours here
        p = dataclasses.replace(p, algorithm=dataclasses.replace(p.algorithm, double_q=False))
    alg = make_algorithm(p, 0)
    batch = replay_batch(p, alg)
    B = p.trainer["mini_batch_size"]
    samples = sb3_replay_samples(batch, isinstance(gym.make(env_id).action_space,
                                                   gym.spaces.Discrete))
    model = _sb3_model(p, make_vec_env(env_id, n_envs=p.trainer.get("num_envs", 1), seed=0), 0)
    model.replay_buffer.sample = lambda batch_size, env=None: samples
    model.set_logger(Logger(folder=None, output_formats=[]))
    # SB3 trains after its warm-up; these updates are timed the same way as ours.
    model._current_progress_remaining = 1.0

    def sb3_update():
        model.train(gradient_steps=1, batch_size=B)

    plain = plain_dqn(p, samples) if algo == "dqn" else plain_sac(p, samples)
    bf16 = _twin(p, alg, precision="bfloat16")
    sides = {"ours": lambda: alg.train_on(batch), "ours_bf16": lambda: bf16.train_on(batch),
             "sb3": sb3_update, "plain": plain}
    if algo == "dqn":  # ours through autograd: what the update without it gains
        autograd = _twin(p, alg)
        autograd._by_hand = None
        sides["ours_autograd"] = lambda: autograd.train_on(batch)
    if algo == "sac":  # as graphs/sac_pendulum.yaml trains: both halves at once
        par = _twin(p, alg, precision="bfloat16", parallel_update=True)
        sides["ours_bf16_par"] = lambda: par.train_on(batch)
    return sides, 1


def _twin(p, alg, **changes):
    """The same algorithm with ``changes`` to its config and the same initial weights."""
    twin = make_algorithm(
        dataclasses.replace(p, algorithm=dataclasses.replace(p.algorithm, **changes)), 0)
    twin.load_state_dict(alg.state_dict())
    return twin


def ppo_sides(env_id: str):
    from stable_baselines3.common.env_util import make_vec_env

    from bench.learning import _sb3_model

    p = get_preset("ppo", env_id)
    alg = make_algorithm(p, 0)
    n, T = p.trainer["num_envs"], p.trainer["unroll_length"]
    epochs = p.algorithm.num_epochs
    unroll = stack_experience(collect(alg, env_id, n, T + 1))  # [T + 1, B]

    model = _sb3_model(p, make_vec_env(env_id, n_envs=n, seed=0), 0)
    model._setup_learn(T * n, callback=None)
    from stable_baselines3.common.callbacks import BaseCallback

    class _Nothing(BaseCallback):
        def _on_step(self) -> bool:
            return True

    cb = _Nothing()
    cb.init_callback(model)
    model.collect_rollouts(model.env, cb, model.rollout_buffer, n_rollout_steps=T)

    def rows(x):  # [T + 1, B, ...] -> the T * B trained rows
        x = torch.as_tensor(np.asarray(x[:-1]))
        return x.reshape(-1, *x.shape[2:])

    mb = {"obs": rows(unroll.observation), "actions": rows(unroll.action).long(),
          "logp": rows(unroll.rollout_info["log_prob"]),
          "adv": torch.randn(T * n), "returns": torch.randn(T * n)}
    plain = plain_ppo(p, mb)
    bf16 = _twin(p, alg, precision="bfloat16")
    return {"ours": lambda: alg.train_on(unroll), "ours_bf16": lambda: bf16.train_on(unroll),
            "sb3": model.train, "plain": plain}, epochs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algos", default="dqn,sac,ppo")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--updates", type=int, default=200, help="updates per timed block")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for algo in args.algos.split(","):
            env_id = TASKS[algo]
            sides, per_call = (ppo_sides(env_id) if algo == "ppo"
                               else off_policy_sides(algo, env_id))
            # PPO: ours and SB3 run every epoch per call, the plain update one mini-batch.
            updates = max(args.updates // (per_call * 4), 5) if per_call > 1 else args.updates
            ms = {}
            for name, update in sides.items():
                calls = updates * per_call if name == "plain" else updates
                torch.set_num_threads(threads)  # each side timed at the same setting
                t = timed(update, calls, args.repeats, warmup=max(calls // 4, 3))
                ms[name] = t if name == "plain" else t / per_call
            row = {"algo": algo, "env": env_id, "threads": threads,
                   **{f"{k}_ms": round(v, 3) for k, v in ms.items()},
                   "ours/sb3": round(ms["ours"] / ms["sb3"], 3),
                   "ours/plain": round(ms["ours"] / ms["plain"], 3),
                   "ours_bf16/sb3": round(ms["ours_bf16"] / ms["sb3"], 3)}
            parallel = ""
            if "ours_autograd" in ms:
                row["ours/ours_autograd"] = round(ms["ours"] / ms["ours_autograd"], 3)
                parallel = (f"  ours through autograd {ms['ours_autograd']:.3f} "
                            f"(ours/it {row['ours/ours_autograd']:.3f})")
            if "ours_bf16_par" in ms:
                row["ours_bf16_par/sb3"] = round(ms["ours_bf16_par"] / ms["sb3"], 3)
                parallel = (f"  ours bf16 parallel {ms['ours_bf16_par']:.3f} "
                            f"(/sb3 {row['ours_bf16_par/sb3']:.3f})")
            rows.append(row)
            unit = "epoch" if algo == "ppo" else "update"
            print(f"{algo:4s} {env_id:12s} threads={threads}  ms per {unit}: "
                  f"ours {ms['ours']:.3f}  ours bf16 {ms['ours_bf16']:.3f}  "
                  f"sb3 {ms['sb3']:.3f}  plain {ms['plain']:.3f}  "
                  f"ours/sb3 {row['ours/sb3']:.3f}  ours/plain {row['ours/plain']:.3f}  "
                  f"ours bf16/sb3 {row['ours_bf16/sb3']:.3f}{parallel}",
                  flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
