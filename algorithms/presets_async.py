"""Reference tasks of IMPALA and APPO (see :class:`algorithms.preset_base.Preset`);
:mod:`algorithms.presets` merges this table into ``PRESETS``."""

from __future__ import annotations

from algorithms.config_async import AppoConfig, ImpalaConfig
from algorithms.preset_base import Preset

PRESETS: dict[str, Preset] = {
    # PPO-CartPole's settings (algorithms/presets.py) with V-trace targets.
    "appo-CartPole-v1": Preset(
        "CartPole-v1", 100_000, 475.0,
        algorithm=AppoConfig(
            actor_fc_layer_params=[64, 64], value_fc_layer_params=[64, 64], learning_rate=1e-3,
            gamma=0.98, td_lambda=0.8, importance_ratio_clipping=0.2, entropy_regularization=0.0,
            td_loss_weight=0.5, num_epochs=20, mini_batch_size=256),
        trainer=dict(num_envs=8, unroll_length=32, eval_interval=5000)),
    "impala-CartPole-v1": Preset(
        "CartPole-v1", 200_000, 475.0,
        algorithm=ImpalaConfig(
            actor_fc_layer_params=[64, 64], value_fc_layer_params=[64, 64], learning_rate=3e-4,
            gamma=0.98, td_lambda=1.0, entropy_regularization=0.01, td_loss_weight=0.5,
            num_epochs=1, mini_batch_size=256, normalize_advantages=False),
        trainer=dict(num_envs=8, unroll_length=32, eval_interval=5000)),
}
