"""Learning from pixels through the real graph: MinAtar Breakout (10x10 uint8 frames) reaches a
mean greedy return of 8 (random play: ~0.5) within 1M env steps, with DQN and with PPO.

Slow (minutes to tens of minutes each on a 2-core machine), so not part of CI; CI runs the
pixel path through ``test_pixels_dtypes.py``. Skips without the ``[minatar]`` extra.
"""

from __future__ import annotations

import pytest

from algorithms.envs import minatar
from tests.test_graphs_training import assert_accounting, eval_returns, live, reached  # noqa: F401

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not minatar.installed(), reason="needs the [minatar] extra")]


@pytest.mark.timeout(7200)
@pytest.mark.parametrize("name", ["dqn_minatar", "ppo_minatar"])
def test_minatar_breakout_reaches_8_within_1m_steps(live, name):  # noqa: F811
    run = live(name)
    assert run.finish(7000) == 0, run.stderr
    assert reached(run, 8, 1_000_000) is not None, eval_returns(run)
    assert_accounting(run)
