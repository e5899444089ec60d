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

An algorithm built from a config (:func:`from_configs`) always uses ``"replay"``: the learner
updates the statistics on its training data and ships them with the parameters (same version);
the unroller and evaluator only apply them. Tensors keep their device; numpy input becomes a CPU
tensor.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from algorithms.data import Experience, StepType, TimeStep, to_tensor
from algorithms.encoders import channel_axis, image_layout


def _t(x, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor of ``x`` on its own device (numpy -> CPU)."""
    if isinstance(x, torch.Tensor):
        return x if dtype is None or x.dtype == dtype else x.to(dtype)
    return to_tensor(x, "cpu", dtype)


def _float_space(space: gym.Space) -> gym.Space:
    return gym.spaces.Box(-np.inf, np.inf, space.shape, np.float32)


class DataTransformer(nn.Module):
    """Identity transformer and the base of the others."""

    def get_initial_state(self, batch_size: int) -> Any:
        return ()

    def transform_timestep(self, time_step: TimeStep, state=()) -> tuple[TimeStep, Any]:
        return time_step, state

    def transform_experience(self, experience: Experience) -> Experience:
        return experience

    def transformed_space(self, observation_space: gym.Space) -> gym.Space:
        """The observation space the algorithm's networks see after this transformer."""
        return observation_space


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
        obs = _t(obs, torch.float32).to(self.stats.mean.device)
        mean = self.stats.mean.float() if self.zero_mean else 0.0
        out = (obs - mean) / (self.stats.var.float().sqrt() + 1e-8)
        if self.clipping > 0:
            out = out.clamp(-self.clipping, self.clipping)
        return out

    def transform_timestep(self, time_step, state=()):
        if self.update_mode == "rollout":
            self.stats.update(_t(time_step.observation))
        return time_step._replace(observation=self.normalize(time_step.observation)), state

    def transform_experience(self, experience):
        if self.update_mode == "replay":
            self.stats.update(_t(experience.observation))
        return experience._replace(observation=self.normalize(experience.observation))

    def transformed_space(self, observation_space):
        return _float_space(observation_space)


class RewardClipping(DataTransformer):
    """Clip rewards to ``minmax``."""

    def __init__(self, observation_space=None, minmax=(-1.0, 1.0)):
        super().__init__()
        self.minmax = tuple(minmax)

    def _r(self, r):
        return _t(r, dtype=torch.float32).clamp(*self.minmax)

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
        return time_step._replace(reward=_t(time_step.reward, dtype=torch.float32)
                                  * self.scale), state

    def transform_experience(self, experience):
        return experience._replace(reward=_t(experience.reward, dtype=torch.float32)
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
        out = r / (self.stats.var.float().sqrt().to(r.device) + 1e-8)
        return out.clamp(-self.clip_value, self.clip_value) if self.clip_value > 0 else out

    def transform_timestep(self, time_step, state=()):
        r = _t(time_step.reward, dtype=torch.float32)
        if self.update_mode == "rollout":
            self._update(r)
        return time_step._replace(reward=self._normalize(r)), state

    def transform_experience(self, experience):
        r = _t(experience.reward, dtype=torch.float32)
        if self.update_mode == "replay":
            self._update(r)
        return experience._replace(reward=self._normalize(r))


class ImageScaleTransformer(DataTransformer):
    """Map uint8 images in ``[0, 255]`` linearly to ``[min, max]`` (float32)."""

    def __init__(self, observation_space=None, min: float = -1.0, max: float = 1.0):  # noqa: A002
        super().__init__()
        self.lo, self.hi = min, max

    def _scale(self, obs):
        return _t(obs, dtype=torch.float32) * ((self.hi - self.lo) / 255.0) + self.lo

    def transform_timestep(self, time_step, state=()):
        return time_step._replace(observation=self._scale(time_step.observation)), state

    def transform_experience(self, experience):
        return experience._replace(observation=self._scale(experience.observation))

    def transformed_space(self, observation_space):
        return gym.spaces.Box(min(self.lo, self.hi), max(self.lo, self.hi),
                              observation_space.shape, np.float32)


class FrameStacker(DataTransformer):
    """Stack the last ``stack_size`` observations along ``stack_axis`` (of one observation).

    Within an episode the stack holds the previous frames; at FIRST (and before it) it is
    filled with the FIRST frame, so no frame of a previous episode leaks in. ``stack_axis``
    None: the channel axis of an image (last for HWC, first for CHW), axis 0 of a vector, and a
    new leading axis for a ``[H, W]`` grayscale frame (giving ``[stack_size, H, W]``).

    ``transform_timestep``: ``state`` is ``[B, stack_size - 1, ...]`` previous frames (None:
    start from this step), or ``()``: the previous frames are kept here, per ``env_id``, which
    is how the pipeline's unroller and evaluator (that pass ``()``) use it.
    ``transform_experience``: a batch-major ``[B, T]`` batch becomes ``[B, T - stack_size + 1]``
    (the first ``stack_size - 1`` rows only provide history; ALF's
    ``num_earliest_frames_ignored``). With ``time_major`` (an on-policy ``[T, B]`` unroll) no row
    is dropped: consecutive unrolls of an env overlap by one step (the bootstrap row starts the
    next unroll), so the history after row ``T - 2`` is kept per ``env_id`` and the next
    unroll's first rows get the stacks the unroller acted on. An unroll whose first frame is not
    the previous one's last (a skipped unroll, a new env) starts from copies of its first frame.
    """

    def __init__(self, observation_space=None, stack_size: int = 4, stack_axis: int | None = 0,
                 image_layout: str = "auto", time_major: bool = False):
        super().__init__()
        self.stack_size, self.time_major = stack_size, time_major
        shape = tuple(observation_space.shape) if observation_space is not None else None
        self.new_axis = stack_axis is None and shape is not None and \
            _is_gray(shape, image_layout)
        if stack_axis is None:
            stack_axis = 0 if shape is None else channel_axis(shape, image_layout)
        self.stack_axis = stack_axis
        self._frames: torch.Tensor | None = None  # [num env ids, stack_size - 1, ...]
        self._seen: torch.Tensor | None = None
        # Training-side history of on-policy unrolls, apart from the acting side's (one
        # process may do both: the synchronous trainer).
        self._unroll_history: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def get_initial_state(self, batch_size: int):
        return None  # filled from the first frame

    def transformed_space(self, observation_space):
        k = self.stack_size
        if self.new_axis:
            low = np.repeat(observation_space.low[None], k, 0)
            high = np.repeat(observation_space.high[None], k, 0)
        else:
            low = np.concatenate([observation_space.low] * k, self.stack_axis)
            high = np.concatenate([observation_space.high] * k, self.stack_axis)
        return gym.spaces.Box(low, high, low.shape, observation_space.dtype)

    def _stack(self, frames: list[torch.Tensor]) -> torch.Tensor:
        if self.new_axis:
            return torch.stack(frames, dim=1)
        axis = self.stack_axis if self.stack_axis < 0 else self.stack_axis + 1
        return torch.cat(frames, dim=axis)

    def _by_env(self, env_id, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Previous frames of each env id and which env ids have history."""
        ids = (torch.arange(obs.shape[0]) if isinstance(env_id, tuple) else
               _t(env_id, torch.int64)).to(obs.device)
        n = int(ids.max()) + 1 if ids.numel() else 0
        k = self.stack_size - 1
        if self._frames is None or self._frames.shape[0] < n or \
                self._frames.shape[2:] != obs.shape[1:] or self._frames.device != obs.device:
            frames = obs.new_zeros((n, k, *obs.shape[1:]))
            seen = torch.zeros(n, dtype=torch.bool, device=obs.device)
            if self._frames is not None and self._frames.shape[2:] == obs.shape[1:]:
                m = min(n, self._frames.shape[0])
                frames[:m], seen[:m] = self._frames[:m].to(obs.device), self._seen[:m]
            self._frames, self._seen = frames, seen
        return ids, self._seen[ids]

    def transform_timestep(self, time_step, state=None):
        obs = _t(time_step.observation)
        k = self.stack_size - 1
        if k == 0:
            return time_step._replace(observation=obs), state
        reset = _t(time_step.step_type).to(obs.device) == StepType.FIRST
        if isinstance(state, tuple):
            return self._transform_by_env(time_step, obs, reset)
        prev = obs.unsqueeze(1).expand(obs.shape[0], k, *obs.shape[1:]) if state is None \
            else state
        sel = reset.view(-1, *([1] * obs.dim()))
        prev = torch.where(sel, obs.unsqueeze(1), prev)
        frames = [prev[:, i] for i in range(k)] + [obs]
        new_state = torch.stack(frames[1:], 1)
        return time_step._replace(observation=self._stack(frames)), new_state

    def _transform_by_env(self, time_step, obs: torch.Tensor, reset: torch.Tensor):
        """The unroller's and evaluator's path (history kept here per env id), with as few
        copies of the frames as it can: one gather, one window, one scatter (the unroller
        spent 13% of its time here on Atari with the generic path's five)."""
        ids, seen = self._by_env(time_step.env_id, obs)
        prev = self._frames[ids]  # a copy: [B, k, ...]
        fresh = reset | ~seen
        if bool(fresh.any()):
            prev[fresh] = obs[fresh].unsqueeze(1)
        window = torch.cat([prev, obs.unsqueeze(1)], 1)  # [B, k + 1, ...], oldest first
        self._frames[ids] = window[:, 1:]
        self._seen[ids] = True
        stacked = window if self.new_axis else self._stack(list(window.unbind(1)))
        return time_step._replace(observation=stacked), ()

    def transform_experience(self, experience):
        if self.time_major:
            swap = lambda e: e.map(lambda v: _t(v).transpose(0, 1))  # noqa: E731
            return swap(self._stack_window(swap(experience), drop=0, carry=True))
        return self._stack_window(experience, drop=self.stack_size - 1)

    def _carried_state(self, env_id, first_obs: torch.Tensor):
        """History for each column of an unroll from the previous unroll of its env id, or
        None where there is none that ends on this unroll's first frame."""
        if isinstance(env_id, tuple) or self.stack_size == 1:
            return None, None
        ids = [int(i) for i in _t(env_id)[:, 0].tolist()]
        state = first_obs.unsqueeze(1).expand(
            first_obs.shape[0], self.stack_size - 1, *first_obs.shape[1:]).clone()
        for col, env in enumerate(ids):
            kept = self._unroll_history.get(env)
            if kept is not None and kept[1].shape == first_obs[col].shape and \
                    torch.equal(kept[1].to(first_obs.device), first_obs[col]):
                state[col] = kept[0].to(first_obs.device)
        return state, ids

    def _stack_window(self, experience, drop: int, carry: bool = False):
        obs = _t(experience.observation)  # [B, T, ...]
        st = _t(experience.step_type)
        T = st.shape[1]
        state, ids = self._carried_state(experience.env_id, obs[:, 0]) if carry else (None, None)
        stacked = []
        # Walk the window once, carrying the stack and resetting it at FIRST.
        for t in range(T):
            ts = TimeStep(step_type=st[:, t], observation=obs[:, t])
            out, state = self.transform_timestep(ts, state)
            stacked.append(out.observation)
            if ids is not None and t == T - 2:
                # The history the last (bootstrap) row, the next unroll's first, is stacked on.
                for col, env in enumerate(ids):
                    self._unroll_history[env] = (state[col].clone(), obs[col, T - 1].clone())
        new_obs = torch.stack(stacked, 1)[:, drop:]
        trimmed = experience.map(lambda v: _t(v)[:, drop:])
        return trimmed._replace(observation=new_obs)


def _is_gray(shape, layout: str) -> bool:
    return image_layout(shape, layout) == "hw"


class ObservationConcat(DataTransformer):
    """A ``Dict`` observation's arrays concatenated into one float32 vector, in ``keys``
    order (default: every key, sorted), each flattened: ``[B, ...]`` or ``[B, T, ...]`` dicts
    in, ``[B, N]`` or ``[B, T, N]`` out.

    Why a transformer and not a network input: every algorithm's networks take one array
    (``input_space``), and a goal-conditioned policy is an ordinary policy of
    ``[observation, desired_goal]``. Concatenating where the transformers run (the unroller
    and evaluator on time steps, the learner on replay batches) leaves the algorithms as they
    are, while the env runners, the wire and the replay store keep the dict's fields apart:
    hindsight relabeling rewrites ``desired_goal`` in replay before the learner concatenates.
    An algorithm built for a ``Dict`` space gets one first with every key when its config
    lists none (:func:`from_configs`); list ``{name: observation_concat, keys: [...]}`` first
    to choose the keys and their order (FetchReach: ``[observation, desired_goal]``; its
    ``achieved_goal`` is the gripper position, already in ``observation``).
    """

    def __init__(self, observation_space, keys: list[str] | None = None):
        super().__init__()
        if not isinstance(observation_space, gym.spaces.Dict):
            raise ValueError(f"observation_concat needs a Dict observation space, got "
                             f"{observation_space}")
        spaces = observation_space.spaces
        self.keys = list(keys) if keys else sorted(spaces)
        unknown = [k for k in self.keys if k not in spaces]
        if unknown:
            raise ValueError(f"observation_concat: no key {unknown[0]!r} in the observation "
                             f"(keys: {', '.join(spaces)})")
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"observation_concat: keys repeat: {self.keys}")
        self.shapes = {k: tuple(spaces[k].shape) for k in self.keys}
        self.size = sum(int(np.prod(shape)) for shape in self.shapes.values())

    def concat(self, observation) -> torch.Tensor:
        if not isinstance(observation, dict):
            raise TypeError(f"observation_concat expects a dict observation, got "
                            f"{type(observation).__name__}")
        parts = []
        for key in self.keys:
            x = _t(observation[key], torch.float32)
            batch = x.shape[:x.ndim - len(self.shapes[key])]
            parts.append(x.reshape(*batch, -1))
        return torch.cat(parts, -1)

    def transform_timestep(self, time_step, state=()):
        return time_step._replace(observation=self.concat(time_step.observation)), state

    def transform_experience(self, experience):
        return experience._replace(observation=self.concat(experience.observation))

    def transformed_space(self, observation_space):
        return gym.spaces.Box(-np.inf, np.inf, (self.size,), np.float32)


class SequentialDataTransformer(DataTransformer):
    """Apply transformers in order; state is the tuple of their states."""

    def __init__(self, transformers: list[DataTransformer]):
        super().__init__()
        self.transformers = nn.ModuleList(transformers)

    def get_initial_state(self, batch_size: int):
        return tuple(t.get_initial_state(batch_size) for t in self.transformers)

    def transform_timestep(self, time_step, state=()):
        """``state``: the tuple of the transformers' states, or ``()`` (each gets ``()``)."""
        if state is None:
            state = self.get_initial_state(0)
        states = state if state != () else ((),) * len(self.transformers)
        new_states = []
        for t, s in zip(self.transformers, states, strict=True):
            time_step, s = t.transform_timestep(time_step, s)
            new_states.append(s)
        return time_step, (tuple(new_states) if state != () else ())

    def transform_experience(self, experience):
        for t in self.transformers:
            experience = t.transform_experience(experience)
        return experience

    def transformed_space(self, observation_space):
        for t in self.transformers:
            observation_space = t.transformed_space(observation_space)
        return observation_space

    @property
    def history_length(self) -> int:
        """Rows a batch-major training window needs before its first trained row."""
        return sum(t.stack_size - 1 for t in self.transformers
                   if isinstance(t, FrameStacker) and not t.time_major)


_TRANSFORMERS = {
    "identity": DataTransformer,
    "observation_normalizer": ObservationNormalizer,
    "reward_clipping": RewardClipping,
    "reward_scaling": RewardScaling,
    "reward_normalizer": RewardNormalizer,
    "image_scale": ImageScaleTransformer,
    "frame_stacker": FrameStacker,
    "observation_concat": ObservationConcat,
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


def from_configs(configs, observation_space, image_layout: str = "auto",
                 time_major: bool = False) -> SequentialDataTransformer:
    """The transformers of an algorithm config's ``data_transformers`` (typed configs from
    :mod:`algorithms.configs`), in order; each sees the space its predecessor produces.
    Normalizers update on training data only (``update_mode="replay"``). A ``Dict``
    observation space gets :class:`ObservationConcat` of every key first unless the configs
    start with one."""
    out: list[DataTransformer] = []
    space = observation_space
    named = [c.name for c in configs]
    if "observation_concat" in named[1:]:
        raise ValueError("data_transformers: observation_concat must come first (the "
                         "others take the vector it makes)")
    if isinstance(space, gym.spaces.Dict) and named[:1] != ["observation_concat"]:
        out.append(ObservationConcat(space))
        space = out[0].transformed_space(space)
    for c in configs:
        kwargs = {k: v for k, v in vars(c).items() if k != "name"}
        if c.name in ("observation_normalizer", "reward_normalizer"):
            kwargs["update_mode"] = "replay"
        if c.name == "frame_stacker":
            kwargs.update(image_layout=image_layout, time_major=time_major)
        t = make_transformer(c.name, space, **kwargs)
        space = t.transformed_space(space)
        out.append(t)
    return SequentialDataTransformer(out)
