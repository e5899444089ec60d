"""``train_on_mini_batches``: the mini-batches of one sample request, each update the one
``train_on`` of its rows makes, the data transformers seeing one mini-batch at a time."""

import numpy as np
import pytest
import torch

import algorithms
from algorithms import configs
from algorithms.data import mini_batch_rows
from tests.test_alg_dqn_by_hand import ACTIONS, OBS, _batch


def _dqn(**kwargs):
    config = configs.parse({"name": "dqn", "fc_layer_params": [16, 8],
                            "target_update_period": 5, **kwargs})
    torch.manual_seed(0)
    return algorithms.make(config, OBS, ACTIONS, device="cpu")


@pytest.mark.parametrize("transformers", [[], [{"name": "observation_normalizer"}]])
@pytest.mark.parametrize("weighted", [False, True])
def test_each_mini_batch_is_trained_as_train_on_would(transformers, weighted):
    """Across two target-network updates; with an observation normalizer, whose statistics
    move mini-batch by mini-batch."""
    request = _batch(12 * 8, 2, seed=1)
    w = np.random.default_rng(2).uniform(0.2, 1.0, 96).astype(np.float32) if weighted else None
    batched, single = _dqn(data_transformers=transformers), _dqn(data_transformers=transformers)
    results = list(batched.train_on_mini_batches(request, 8, w))
    assert len(results) == 12
    for i, result in enumerate(results):
        rows = slice(8 * i, 8 * i + 8)
        expected = single.train_on(request.map(lambda x, rows=rows: x[rows]),
                                   None if w is None else w[rows])
        torch.testing.assert_close(result.priorities, expected.priorities)
        assert dict(result.metrics) == dict(expected.metrics)
    assert batched.num_updates == single.num_updates == 12
    for key, value in batched.state_dict().items():
        torch.testing.assert_close(value, single.state_dict()[key], msg=key)


def test_each_update_happens_when_its_result_is_asked_for():
    """The caller acts between updates (priorities, parameters): nothing runs ahead."""
    alg = _dqn()
    updates = alg.train_on_mini_batches(_batch(24, 2, seed=0), 8)
    assert alg.num_updates == 0
    next(updates)
    assert alg.num_updates == 1
    updates.close()
    assert alg.num_updates == 1


def test_mini_batch_rows_cover_every_row_once():
    assert mini_batch_rows(_batch(20, 2, seed=0), 8) == [slice(0, 8), slice(8, 16), slice(16, 20)]
