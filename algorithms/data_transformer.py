"""Data transformers (ALF's ``data_transformer``): reshape what the algorithm sees.

Where they run (ALF's split):

* ``transform_timestep(time_step, state) -> (time_step, state)``: in the unroller / evaluator,
  before ``rollout_step``/``predict_step``; ``time_step`` fields are ``[B, ...]``; ``state`` is
  per-environment (``get_initial_state(batch_size)``), e.g. FrameStacker's previous frames.
* ``transform_experience(experience) -> experience``: in the learner, on a replay batch
  ``[B, T, ...]`` (batch-major) before ``train_on``.

Statistics (normalizers) update in one place, chosen by ``update_mode``: ``"rollout"`` (in
``transform_timestep``) or ``"replay"`` (in ``transform_experience``). Statistics are buffers, so
``state_dict()`` checkpoints them and the learner can ship them to unrollers with the policy.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from algorithms.data import Experience, StepType, TimeStep, to_tensor


class DataTransformer(nn.Module):
    """Identity transformer and the base of the others."""

    def get_initial_state(self, batch_size: int) -> Any:
        return ()

    def transform_timestep(self, time_step: TimeStep, state=()) -> tuple[TimeStep, Any]:
        return time_step, state

    def transform_experience(self, experience: Experience) -> Experience:
        return experience


IdentityDataTransformer = DataTransformer


class _RunningMeanStd(nn.Module):
    """Exact running mean/variance over every update (Chan et al. parallel formula), or an
    exponential moving average with ``update_rate`` if given."""

    def __init__(self, shape, update_rate: float | None = None):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.update_rate = update_rate

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, *self.mean.shape).to(torch.float64)
        b_mean, b_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        if self.update_rate is not None and self.count > 0:
            r = self.update_rate
            delta = b_mean - self.mean
            self.mean += r * delta
            self.var.mul_(1 - r).add_(r * (b_var + (1 - r) * delta ** 2))
            self.count += n
            return
        total = self.count + n
        delta = b_mean - self.mean
        self.mean += delta * n / total
        self.var.copy_((self.var * self.count + b_var * n + delta ** 2 * self.count * n / total)
                       / total)
        self.count.copy_(total)


class ObservationNormalizer(DataTransformer):
    """Normalize observations with running statistics: ``(obs - mean) / (std + eps)``.

    observation_space: the observation space (its shape sizes the statistics).
    clipping: clip normalized observations to ``[-clipping, clipping]`` if > 0.
    zero_mean: subtract the mean (else only divide by the std).
    update_mode: ``"rollout"`` or ``"replay"`` (where the statistics update).
    update_rate: None for exact running statistics; else an EMA rate.
    """

    def __init__(self, observation_space, clipping: float = 0.0, zero_mean: bool = True,
                 update_mode: str = "replay", update_rate: float | None = None):
        super().__init__()
        assert update_mode in ("rollout", "replay"), update_mode
        self.stats = _RunningMeanStd(tuple(observation_space.shape), update_rate)
        self.clipping, self.zero_mean, self.update_mode = clipping, zero_mean, update_mode

    def normalize(self, obs) -> torch.Tensor:
        obs = to_tensor(obs, self.stats.mean.device, torch.float32)
        mean = self.stats.mean.float() if self.zero_mean else 0.0
        out = (obs - mean) / (self.stats.var.float().sqrt() + 1e-8)
        if self.clipping > 0:
            out = out.clamp(-self.clipping, self.clipping)
        return out

    def transform_timestep(self, time_step, state=()):
        if self.update_mode == "rollout":
            self.stats.update(to_tensor(time_step.observation))
        return time_step._replace(observation=self.normalize(time_step.observation)), state

    def transform_experience(self, experience):
        if self.update_mode == "replay":
            self.stats.update(to_tensor(experience.observation))
        return experience._replace(observation=self.normalize(experience.observation))


class RewardClipping(DataTransformer):
    """Clip rewards to ``minmax``."""

    def __init__(self, observation_space=None, minmax=(-1.0, 1.0)):
        super().__init__()
        self.minmax = tuple(minmax)

    def _r(self, r):
        return to_tensor(r, dtype=torch.float32).clamp(*self.minmax)

    def transform_timestep(self, time_step, state=()):
        return time_step._replace(reward=self._r(time_step.reward)), state

    def transform_experience(self, experience):
        return experience._replace(reward=self._r(experience.reward))


class RewardScaling(DataTransformer):
    """Multiply rewards by ``scale``."""

    def __init__(self, observation_space=None, scale: float = 1.0):
        super().__init__()
        self.scale = scale

    def transform_timestep(self, time_step, state=()):
        return time_step._replace(reward=to_tensor(time_step.reward, dtype=torch.float32)
                                  * self.scale), state

    def transform_experience(self, experience):
        return experience._replace(reward=to_tensor(experience.reward, dtype=torch.float32)
                                   * self.scale)


class RewardNormalizer(DataTransformer):
    """Divide rewards by their running std (the sign and zero are kept).

    update_max_calls: stop updating the statistics after this many updates (0 = never stop).
    clip_value: clip normalized rewards to ``[-clip_value, clip_value]`` if > 0.
    update_mode: ``"rollout"`` or ``"replay"``.
    """

    def __init__(self, observation_space=None, update_max_calls: int = 0,
                 clip_value: float = -1.0, update_mode: str = "replay"):
        super().__init__()
        self.stats = _RunningMeanStd(())
        self.register_buffer("update_calls", torch.zeros((), dtype=torch.int64))
        self.update_max_calls, self.clip_value, self.update_mode = (
            update_max_calls, clip_value, update_mode)

    def _update(self, r):
        if self.update_max_calls <= 0 or int(self.update_calls) < self.update_max_calls:
            self.stats.update(r)
            self.update_calls += 1

    def _normalize(self, r):
        out = r / (self.stats.var.float().sqrt() + 1e-8)
        return out.clamp(-self.clip_value, self.clip_value) if self.clip_value > 0 else out

    def transform_timestep(self, time_step, state=()):
        r = to_tensor(time_step.reward, dtype=torch.float32)
        if self.update_mode == "rollout":
            self._update(r)
        return time_step._replace(reward=self._normalize(r)), state

    def transform_experience(self, experience):
        r = to_tensor(experience.reward, dtype=torch.float32)
        if self.update_mode == "replay":
            self._update(r)
        return experience._replace(reward=self._normalize(r))


class ImageScaleTransformer(DataTransformer):
    """Map uint8 images in ``[0, 255]`` linearly to ``[min, max]`` (float32)."""

    def __init__(self, observation_space=None, min: float = -1.0, max: float = 1.0):  # noqa: A002
        super().__init__()
        self.lo, self.hi = min, max

    def _scale(self, obs):
        return to_tensor(obs, dtype=torch.float32) * ((self.hi - self.lo) / 255.0) + self.lo

    def transform_timestep(self, time_step, state=()):
        return time_step._replace(observation=self._scale(time_step.observation)), state

    def transform_experience(self, experience):
        return experience._replace(observation=self._scale(experience.observation))


class FrameStacker(DataTransformer):
    """Stack the last ``stack_size`` observations along ``stack_axis`` (of one observation).

    Within an episode the stack holds the previous frames; at FIRST (and before it) it is
    filled with the FIRST frame, so no frame of a previous episode leaks in.

    ``transform_timestep``: ``state`` is ``[B, stack_size - 1, ...]`` previous frames.
    ``transform_experience``: a ``[B, T]`` batch becomes ``[B, T - stack_size + 1]`` (the first
    ``stack_size - 1`` rows only provide history; ALF's ``num_earliest_frames_ignored``).
    """

    def __init__(self, observation_space=None, stack_size: int = 4, stack_axis: int = 0):
        super().__init__()
        self.stack_size, self.stack_axis = stack_size, stack_axis

    def get_initial_state(self, batch_size: int):
        return None  # filled from the first frame

    def _stack(self, frames: list[torch.Tensor]) -> torch.Tensor:
        axis = self.stack_axis if self.stack_axis < 0 else self.stack_axis + 1
        return torch.cat(frames, dim=axis)

    def transform_timestep(self, time_step, state=None):
        obs = to_tensor(time_step.observation)
        first = to_tensor(time_step.step_type) == StepType.FIRST
        k = self.stack_size - 1
        if state is None or (isinstance(state, tuple) and state == ()):
            state = obs.unsqueeze(1).expand(obs.shape[0], k, *obs.shape[1:]).clone()
        sel = first.view(-1, *([1] * obs.dim()))
        prev = torch.where(sel, obs.unsqueeze(1), state)
        frames = [prev[:, i] for i in range(k)] + [obs]
        new_state = torch.stack(frames[1:], 1) if k > 0 else prev
        return time_step._replace(observation=self._stack(frames)), new_state

    def transform_experience(self, experience):
        obs = to_tensor(experience.observation)  # [B, T, ...]
        st = to_tensor(experience.step_type)
        k = self.stack_size - 1
        B, T = st.shape[:2]
        # Walk the window once, carrying the stack and resetting it at FIRST.
        stacked, state = [], obs[:, 0].unsqueeze(1).expand(B, k, *obs.shape[2:]).clone()
        for t in range(T):
            ts = TimeStep(step_type=st[:, t], observation=obs[:, t])
            out, state = self.transform_timestep(ts, state)
            stacked.append(out.observation)
        new_obs = torch.stack(stacked, 1)[:, k:]
        trimmed = experience.map(lambda v: to_tensor(v)[:, k:])
        return trimmed._replace(observation=new_obs)


class SequentialDataTransformer(DataTransformer):
    """Apply transformers in order; state is the tuple of their states."""

    def __init__(self, transformers: list[DataTransformer]):
        super().__init__()
        self.transformers = nn.ModuleList(transformers)

    def get_initial_state(self, batch_size: int):
        return tuple(t.get_initial_state(batch_size) for t in self.transformers)

    def transform_timestep(self, time_step, state=()):
        state = state or self.get_initial_state(0)
        new_states = []
        for t, s in zip(self.transformers, state, strict=True):
            time_step, s = t.transform_timestep(time_step, s)
            new_states.append(s)
        return time_step, tuple(new_states)

    def transform_experience(self, experience):
        for t in self.transformers:
            experience = t.transform_experience(experience)
        return experience


_TRANSFORMERS = {
    "identity": DataTransformer,
    "observation_normalizer": ObservationNormalizer,
    "reward_clipping": RewardClipping,
    "reward_scaling": RewardScaling,
    "reward_normalizer": RewardNormalizer,
    "image_scale": ImageScaleTransformer,
    "frame_stacker": FrameStacker,
}


def make_transformer(name_or_specs, observation_space=None, **kwargs) -> DataTransformer:
    """``make_transformer("reward_scaling", obs_space, scale=0.1)``, or a list of
    ``(name, kwargs)`` pairs for a ``SequentialDataTransformer``."""
    if isinstance(name_or_specs, list | tuple):
        return SequentialDataTransformer(
            [make_transformer(n, observation_space, **kw) for n, kw in name_or_specs])
    try:
        cls = _TRANSFORMERS[name_or_specs]
    except KeyError:
        raise ValueError(f"unknown transformer {name_or_specs!r}; known: "
                         f"{sorted(_TRANSFORMERS)}") from None
    if cls is DataTransformer:
        return cls(**kwargs)
    return cls(observation_space, **kwargs)
