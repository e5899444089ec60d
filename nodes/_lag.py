"""Policy lag: how many parameter versions (and gradient updates) old the policy was that
collected a batch, when the learner trains on it.

The unroller stamps every row of an unroll with the version it acted with
(:attr:`nodes.messages.Trajectory.versions`; an unroll spans several versions when the
unroller does not wait for the learner). When the learner takes a batch, each row's lag is
``learner version - row version`` (0: the network being trained is the one that acted), and in
updates the gradient steps taken since that version was published. In a lock-step on-policy
graph (the unroller waits after ``max_unrolls_per_version: 1`` unroll) every row is current but
the first: the row an unroll continues from is the previous unroll's bootstrap row, acted before
the learner trained on that unroll, so the lag is 1 there (mean ``1 / T``, max 1). An
asynchronous one (IMPALA, APPO) has whatever the queue between unroller and learner holds,
which V-trace corrects for.

``max_policy_lag`` bounds it on the learner's side: a batch whose oldest row is older is dropped
and counted (``lag/dropped_batches``, ``lag/dropped_env_steps``, in the status too, and logged
the first time and then every hundredth), never silently. The other bound is upstream: the
unroller's ``max_unrolls_per_version`` makes the runners wait instead.
"""

from __future__ import annotations

import collections
import logging

import numpy as np

log = logging.getLogger(__name__)

# Versions whose publishing iteration is remembered (a batch older than this uses
# ``publish_params_every`` per version, exact while that setting did not change).
_REMEMBERED = 4096


class PolicyLag:
    """Per-batch lag of the rows a learner trains on, summed up per metrics period."""

    def __init__(self, publish_params_every: int, max_policy_lag: int | None):
        self.every = publish_params_every
        self.max_lag = max_policy_lag
        self.published: collections.OrderedDict[int, int] = collections.OrderedDict()
        self.dropped_batches = 0
        self.dropped_env_steps = 0
        self._period: list[np.ndarray] = []
        self._period_updates: list[np.ndarray] = []
        self.last_mean: float | None = None  # the newest admitted batch's mean lag

    def on_publish(self, version: int, iteration: int) -> None:
        """The learner published ``version`` after ``iteration`` updates."""
        self.published[version] = iteration
        while len(self.published) > _REMEMBERED:
            self.published.popitem(last=False)

    def lag(self, versions, learner_version: int, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        """``(versions behind, updates behind)`` of each row, clipped at 0 (a learner restored
        from an older checkpoint is behind the rows it meets, not ahead of them)."""
        v = np.asarray(versions, np.int64)
        behind = np.maximum(learner_version - v, 0)
        at = np.array([self.published.get(int(x), int(x) * self.every) for x in v.ravel()],
                      np.int64).reshape(v.shape)
        return behind, np.maximum(iteration - at, 0)

    def admit(self, versions, learner_version: int, iteration: int, env_steps: int,
              where: str) -> bool:
        """Record a batch's lag; False (dropped, counted) when its oldest row is older than
        ``max_policy_lag`` versions. ``versions`` of None (a producer that does not stamp them)
        is admitted unmeasured."""
        if versions is None or len(versions) == 0:
            return True
        behind, updates = self.lag(versions, learner_version, iteration)
        if self.max_lag is not None and int(behind.max()) > self.max_lag:
            self.dropped_batches += 1
            self.dropped_env_steps += env_steps
            if self.dropped_batches == 1 or self.dropped_batches % 100 == 0:
                log.warning("%s: dropped a batch %d versions old (max_policy_lag %d); "
                            "%d batches, %d env steps dropped so far", where, int(behind.max()),
                            self.max_lag, self.dropped_batches, self.dropped_env_steps)
            return False
        self._period.append(behind.ravel())
        self._period_updates.append(updates.ravel())
        self.last_mean = float(behind.mean())
        return True

    def report(self) -> dict[str, float]:
        """The period's figures (min/mean/max over every trained row), then a new period."""
        out: dict[str, float] = {"lag/dropped_batches": float(self.dropped_batches),
                                 "lag/dropped_env_steps": float(self.dropped_env_steps)}
        if self._period:
            rows = np.concatenate(self._period)
            updates = np.concatenate(self._period_updates)
            out.update({"lag/versions_min": float(rows.min()),
                        "lag/versions_mean": float(rows.mean()),
                        "lag/versions_max": float(rows.max()),
                        "lag/updates_mean": float(updates.mean()),
                        "lag/updates_max": float(updates.max())})
        self._period.clear()
        self._period_updates.clear()
        return out

    def status(self) -> dict:
        """What ``monitor`` shows: the newest batch's mean lag, and the drops if any."""
        out = {} if self.last_mean is None else {"policy_lag": round(self.last_mean, 1)}
        if self.dropped_batches:
            out.update(lag_dropped_batches=self.dropped_batches,
                       lag_dropped_env_steps=self.dropped_env_steps)
        return out
