"""Single-process reference trainer: a Gymnasium vector env, an algorithm and a tiny replay.

This is the in-process counterpart of the env_runner -> unroller -> replay_store -> learner
graph, used by the learning tests and ``bench/learning.py``. It follows the same conventions as
the pipeline (ALF step types, ``NEXT_STEP`` autoreset, stored step = time step t + action t +
rollout_info t, replay batches ``[B, T]``, on-policy unrolls ``[T, B]``).

Greedy evaluation runs ``num_eval_episodes`` episodes in parallel every ``eval_interval`` env
steps; a run *reaches* the threshold at the first evaluation whose mean return is at least the
threshold. Wall-clock figures exclude evaluation time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from algorithms.data import AlgStep, Experience, TimeStep
from algorithms.evaluation import evaluate
from algorithms.steps import VectorEnvStepper, make_vector_env


class TinyReplay:
    """Numpy ring of time steps ``[capacity, num_envs, ...]`` per field.

    ``sample(B, T)`` returns batch-major ``[B, T]`` windows from one env each, fully written and
    never straddling the write head (the newest step is only the end of a window).
    """

    def __init__(self, capacity: int, num_envs: int, rng: np.random.Generator):
        self.capacity, self.num_envs, self.rng = capacity, num_envs, rng
        self.data: dict[str, np.ndarray] = {}
        self.written = 0

    def add(self, exp: Experience) -> None:
        row = {k: np.asarray(v) for k, v in exp.to_dict().items()
               if not (isinstance(v, tuple) and v == ())}
        if not self.data:
            for k, v in row.items():
                self.data[k] = np.zeros((self.capacity, *v.shape), dtype=v.dtype)
        pos = self.written % self.capacity
        for k, v in row.items():
            self.data[k][pos] = v
        self.written += 1

    def sample(self, batch_size: int, length: int) -> Experience:
        size = min(self.written, self.capacity)
        lo, hi = self.written - size, self.written - length  # logical window starts [lo, hi]
        assert hi >= lo, "not enough data for one window"
        start = self.rng.integers(lo, hi + 1, size=batch_size)
        t_idx = (start[:, None] + np.arange(length)[None]) % self.capacity  # [B, T]
        env = self.rng.integers(0, self.num_envs, size=batch_size)[:, None]
        return Experience.from_dict({k: v[t_idx, env] for k, v in self.data.items()})


@dataclass
class TrainerConfig:
    """Driver settings (ALF's ``TrainerConfig`` names where they exist).

    num_envs: parallel training environments.
    num_env_steps: env-step budget (all envs together).
    unroll_length: steps per env between training phases (on-policy: the unroll length T).
    initial_collect_steps: env steps before off-policy training starts.
    num_updates_per_train_iter: gradient updates per training phase (off-policy).
    mini_batch_size: replay batch size B (off-policy).
    mini_batch_length: replay window length T (None: the algorithm's ``mini_batch_length``).
    replay_buffer_length: replay capacity in steps per env.
    eval_interval: env steps between greedy evaluations.
    num_eval_episodes: episodes per evaluation (run in parallel).
    threshold: stop early once an evaluation reaches it (if ``stop_at_threshold``).
    stop_at_threshold: end the run at the first evaluation that reaches ``threshold``.
    num_threads: ``torch.set_num_threads`` for the run.
    """

    num_envs: int = 1
    num_env_steps: int = 50_000
    unroll_length: int = 1
    initial_collect_steps: int = 1000
    num_updates_per_train_iter: int = 1
    mini_batch_size: int = 256
    mini_batch_length: int | None = None
    replay_buffer_length: int = 100_000
    eval_interval: int = 5000
    num_eval_episodes: int = 10
    threshold: float | None = None
    stop_at_threshold: bool = False
    num_threads: int = 1

    @classmethod
    def from_kwargs(cls, **kw) -> TrainerConfig:
        names = {f.name for f in fields(cls)}
        bad = sorted(set(kw) - names)
        if bad:
            raise TypeError(f"unknown trainer option {bad[0]!r}")
        return cls(**kw)


@dataclass
class RunResult:
    """Outcome of ``train``: evaluations ``[(env_steps, train_seconds, mean_return)]``."""

    evals: list[tuple[int, float, float]] = field(default_factory=list)
    env_steps: int = 0
    train_seconds: float = 0.0
    reached_at_steps: int | None = None
    reached_at_seconds: float | None = None
    last_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def best_return(self) -> float:
        return max((e[2] for e in self.evals), default=float("-inf"))

    @property
    def final_return(self) -> float:
        return self.evals[-1][2] if self.evals else float("-inf")


def _to_numpy_action(a) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def _numpy_experience(ts: TimeStep, step: AlgStep) -> Experience:
    info = {k: v.detach().cpu().numpy() for k, v in (step.info or {}).items()}
    return Experience(*ts, action=_to_numpy_action(step.output), rollout_info=info)


def stack_experience(rows: list[Experience], axis: int = 0) -> Experience:
    """Stack per-step experiences ``[B]`` into ``[T, B]`` (axis 0) or ``[B, T]`` (axis 1)."""
    dicts = [r.to_dict() for r in rows]
    return Experience.from_dict({k: np.stack([d[k] for d in dicts], axis) for k, v in dicts[0].items()
                                 if not (isinstance(v, tuple) and v == ())})


def train(alg, env_id: str, config: TrainerConfig, seed: int = 0, log=None) -> RunResult:
    """Train ``alg`` on ``env_id`` for ``config.num_env_steps`` env steps (see module doc)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config.num_threads)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    env = make_vector_env(env_id, config.num_envs, seed, training=True)
    stepper = VectorEnvStepper(env, seed)
    result = RunResult()
    n = config.num_envs
    replay = None if alg.on_policy else TinyReplay(
        max(config.replay_buffer_length, 2), n, rng)
    T = config.mini_batch_length or getattr(alg, "mini_batch_length", 2)
    state = alg.get_initial_state(n)
    ts = stepper.reset()
    env_steps, train_time, next_eval = 0, 0.0, config.eval_interval

    def maybe_eval(force=False) -> bool:
        nonlocal next_eval
        if env_steps < next_eval and not force:
            return False
        next_eval += config.eval_interval
        ret = evaluate(alg, env_id, config.num_eval_episodes, seed=10_000 + seed).mean_return
        result.evals.append((env_steps, train_time, ret))
        if log:
            log(f"steps={env_steps} time={train_time:.1f}s eval={ret:.1f} "
                + " ".join(f"{k}={v:.3g}" for k, v in result.last_metrics.items()))
        if (config.threshold is not None and ret >= config.threshold
                and result.reached_at_steps is None):
            result.reached_at_steps, result.reached_at_seconds = env_steps, train_time
        return config.stop_at_threshold and result.reached_at_steps is not None

    try:
        t0 = time.perf_counter()
        step = alg.rollout_step(ts, state)
        cur = _numpy_experience(ts, step)
        while env_steps < config.num_env_steps:
            rows = [cur]
            for _ in range(config.unroll_length):
                if replay is not None:
                    replay.add(cur)
                ts = stepper.step(cur.action)
                env_steps += n
                state = step.state
                step = alg.rollout_step(ts, state)
                cur = _numpy_experience(ts, step)
                rows.append(cur)
            if alg.on_policy:
                # [T + 1, B]: the last row bootstraps this unroll and starts the next one.
                batch = stack_experience(rows)
                result.last_metrics = alg.train_on(batch).metrics
            elif env_steps >= config.initial_collect_steps and replay.written >= T:
                for _ in range(config.num_updates_per_train_iter):
                    result.last_metrics = alg.train_on(replay.sample(config.mini_batch_size, T)).metrics
            train_time += time.perf_counter() - t0
            stop = maybe_eval()
            t0 = time.perf_counter()
            if stop:
                break
        if not result.evals or result.evals[-1][0] != env_steps:
            maybe_eval(force=True)
    finally:
        env.close()
        torch.set_num_threads(threads)
    result.env_steps, result.train_seconds = env_steps, train_time
    return result
