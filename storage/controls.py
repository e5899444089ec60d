"""DI-engine's buffer controls as components a ``ReplayBuffer`` calls at fixed points.

A control sees four events: ``on_add`` (steps written, with the policy version that
collected them), ``before_sample`` (a sample is about to be drawn, with the learner
iteration), ``on_sample`` (these slots were drawn) and ``on_clear``. It acts through the
buffer's public bookkeeping (``slot_info``, ``evict``). Adding a capability means adding
a control, not a keyword on the buffer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


class BufferControl:
    """Base control: every hook is a no-op."""

    def on_add(self, buffer, env_ids, positions, version) -> None:
        pass

    def before_sample(self, buffer, learner_iter) -> None:
        pass

    def on_sample(self, buffer, slots, learner_iter) -> None:
        pass

    def on_clear(self, buffer, env_ids) -> None:
        pass

    def on_remove(self, buffer, count: int) -> None:
        """``count`` steps stopped being sampleable (evicted or overwritten)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class MaxUse(BufferControl):
    """Evict a slot once it has been sampled ``max_use`` times (DI-engine's max_use)."""

    def __init__(self, max_use: int):
        if max_use < 1:
            raise ValueError(f"max_use must be at least 1, got {max_use}")
        self.max_use = max_use

    def on_sample(self, buffer, slots, learner_iter) -> None:
        counts = buffer.slot_info.use_count
        used_up = slots[counts[slots] >= self.max_use]
        buffer.evict(torch.unique(used_up))


class MaxStaleness(BufferControl):
    """Never sample data collected more than ``max_staleness`` learner iterations ago.

    Staleness is ``learner_iter - version``, where ``version`` is what ``add_batch`` was
    given (the policy version that collected the data). Versions must not decrease
    within an environment (the unroller stamps the newest parameters it has), so stale
    data is always a prefix of each ring: a per-environment frontier walks forward over
    it in windows, and the cost is O(1) per evicted step.
    """

    def __init__(self, max_staleness: int, window: int = 64):
        self.max_staleness = int(max_staleness)
        self.window = int(window)
        self._frontier = None

    def before_sample(self, buffer, learner_iter) -> None:
        if learner_iter is None:
            return
        envs = torch.arange(buffer.num_environments, device=buffer.device)
        if self._frontier is None:
            self._frontier = torch.zeros_like(envs)
        limit = learner_iter - self.max_staleness
        version = buffer.slot_info.version
        steps = torch.arange(self.window, device=buffer.device)
        while True:
            earliest = buffer.writer.earliest(envs)
            self._frontier = torch.maximum(self._frontier, earliest)
            pos = self._frontier[:, None] + steps[None, :]
            stored = pos < buffer.writer.current_pos[:, None]
            slots = envs[:, None] * buffer.max_length + pos % buffer.max_length
            stale = stored & (version[slots] < limit)
            run = torch.cumprod(stale.to(torch.int64), 1).sum(1)  # leading stale steps
            if int(run.sum()) == 0:
                return
            evict = steps[None, :] < run[:, None]
            buffer.evict(slots[evict])
            self._frontier = self._frontier + run
            if not bool((run == self.window).any()):
                return

    def on_clear(self, buffer, env_ids) -> None:
        if self._frontier is not None:
            self._frontier[env_ids] = 0

    def state_dict(self) -> dict:
        return {"frontier": None if self._frontier is None else self._frontier.clone()}

    def load_state_dict(self, state: dict) -> None:
        self._frontier = state["frontier"]


@dataclass
class SampleStatistics(BufferControl):
    """Use count and staleness of the data each sample drew (DI-engine's attr monitor).

    After every ``get_batch``, ``last`` holds the mean/max use count (counting this
    draw), the largest use count a drawn slot had before this draw (``use_before_max``:
    below ``max_use`` when ``MaxUse`` works; a slot may be drawn more than once in one
    draw when few are valid) and, when a learner iteration was given, the mean/max
    staleness. :meth:`take_period` gives the same over every draw since its last call: what
    a periodic report should say (one draw of 32 can miss what the thousands between two
    reports saw).
    """

    last: dict = field(default_factory=dict)
    # Since the last take_period: key -> (sum of the draws' means weighted by items, items)
    # for means, the largest value for maxima.
    _period: dict = field(default_factory=dict)

    def on_sample(self, buffer, slots, learner_iter) -> None:
        uses = buffer.slot_info.use_count[slots].to(torch.float64)
        distinct, drawn = torch.unique(slots, return_counts=True)
        before = buffer.slot_info.use_count[distinct] - drawn
        stats = {
            "use_mean": float(uses.mean()),
            "use_max": float(uses.max()),
            "use_before_max": float(before.max()),
        }
        if learner_iter is not None:
            stale = (learner_iter - buffer.slot_info.version[slots]).to(torch.float64)
            stats.update(staleness_mean=float(stale.mean()), staleness_max=float(stale.max()))
        self.last = stats
        n = len(slots)
        for key, value in stats.items():
            if key.endswith("_mean"):
                total, items = self._period.get(key, (0.0, 0))
                self._period[key] = (total + value * n, items + n)
            else:
                self._period[key] = max(self._period.get(key, value), value)

    def take_period(self) -> dict:
        """The draws since the last call (means weighted by items drawn, maxima over all of
        them), and a new period starts; empty if nothing was drawn."""
        period, self._period = self._period, {}
        return {key: value[0] / value[1] if key.endswith("_mean") else value
                for key, value in period.items()}


class ThroughputMonitor(BufferControl):
    """Pushed / sampled / removed counts per period, and the valid count at its end.

    ``clock`` is injectable (tests pass a fake one). ``poll()`` closes the period when
    ``period_s`` has passed and returns its report (else ``None``); reports are also kept
    in ``history``. Nothing runs in a thread: the owner polls from its own loop.
    """

    def __init__(self, period_s: float = 60.0, clock=time.monotonic):
        self.period_s = float(period_s)
        self.clock = clock
        self.history: list[dict] = []
        self._start = clock()
        self._counts = {"pushed": 0, "sampled": 0, "removed": 0}
        self._buffer = None

    def on_add(self, buffer, env_ids, positions, version) -> None:
        self._buffer = buffer
        self._counts["pushed"] += int(env_ids.numel())

    def on_sample(self, buffer, slots, learner_iter) -> None:
        self._buffer = buffer
        self._counts["sampled"] += int(slots.numel())

    def on_remove(self, buffer, count: int) -> None:
        self._counts["removed"] += int(count)

    def poll(self) -> dict | None:
        now = self.clock()
        if now - self._start < self.period_s:
            return None
        report = dict(self._counts)
        report["valid"] = self._buffer.num_sampleable if self._buffer is not None else 0
        report["period_s"] = now - self._start
        self.history.append(report)
        self._start = now
        self._counts = {"pushed": 0, "sampled": 0, "removed": 0}
        return report

    def state_dict(self) -> dict:
        return {"counts": dict(self._counts), "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self._counts = dict(state["counts"])
        self.history = list(state["history"])


class BetaSchedule(BufferControl):
    """PER's importance-sampling exponent annealed linearly from ``beta_start`` to 1.0
    over the first ``anneal_samples`` sampled items (Schaul et al.; pytorchrl's PER).

    The beta of a draw follows the items drawn before it; the count is in
    ``state_dict``, so a restored buffer goes on from the same beta. The buffer needs
    ``PER(beta=beta_start)`` (the min tree the weights use).
    """

    def __init__(self, beta_start: float, anneal_samples: int):
        if not 0.0 <= beta_start <= 1.0:
            raise ValueError(f"beta_start must lie in [0, 1], got {beta_start}")
        if anneal_samples < 0:
            raise ValueError(f"anneal_samples must be >= 0, got {anneal_samples}")
        self.beta_start = float(beta_start)
        self.anneal_samples = int(anneal_samples)
        self.sampled = 0

    @property
    def beta(self) -> float:
        if self.anneal_samples == 0:
            return self.beta_start
        done = min(1.0, self.sampled / self.anneal_samples)
        return self.beta_start + (1.0 - self.beta_start) * done

    def before_sample(self, buffer, learner_iter) -> None:
        buffer.sampler.set_beta(self.beta)

    def on_sample(self, buffer, slots, learner_iter) -> None:
        self.sampled += int(slots.numel())

    def state_dict(self) -> dict:
        return {"sampled": self.sampled}

    def load_state_dict(self, state: dict) -> None:
        self.sampled = int(state["sampled"])
