"""Priority updates the replay store cannot place (issue 11): after a restart the learner still
sends priorities for steps it drew from the store's previous incarnation. Those rows are stale,
counted and skipped; the rest of the message applies. (The buffer refuses a whole update with
any never-written position, and the replay store's priority task died of it unseen: the learner
then blocked on the full priorities topic.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from nodes.messages import Priorities
from nodes.replay_store import Config, ReplayStore
from tests.test_replay_store_frames import feed


def test_priorities_for_steps_never_written_are_skipped_and_counted(tmp_path):
    node = SimpleNamespace(bus=None, status={},
                           info=SimpleNamespace(device="cpu", run_dir=str(tmp_path)))
    store = ReplayStore(Config(num_environments=2, max_length=32, min_size_to_sample=1,
                               prioritized_sampling=True), node)
    feed(store, 10)  # positions 0..9 of envs 0 and 1
    store.update_priorities(Priorities(np.array([0, 1, 0, 5]), np.array([3, 4000, 7, 1]),
                                       np.array([9.0, 9.0, 2.0, 9.0], dtype=np.float32)))
    assert store.rejected_priorities == 2  # position 4000 of env 1 and env 5 (no such env)
    leaves = store.buffer.sampler.sum_tree.leaves()
    alpha, eps = store.config.priority_replay_alpha, store.config.priority_replay_eps
    max_length = store.buffer.max_length
    for env, pos, priority in ((0, 3, 9.0), (0, 7, 2.0)):
        want = (priority + eps) ** alpha
        assert torch.isclose(leaves[env * max_length + pos].double(),
                             torch.tensor(want, dtype=torch.float64), rtol=1e-5)
