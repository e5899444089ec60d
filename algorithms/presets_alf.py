"""Reference tasks of OAC, TAAC and PPG (see :class:`algorithms.preset_base.Preset`);
:mod:`algorithms.presets` merges this table into ``PRESETS``."""

from __future__ import annotations

from algorithms.config_alf import OacConfig
from algorithms.preset_base import Preset

PRESETS: dict[str, Preset] = {
    # SAC-Pendulum's settings with optimistic exploration (ALF's beta_ub, explore_delta).
    "oac-Pendulum-v1": Preset(
        "Pendulum-v1", 20_000, -200.0,
        algorithm=OacConfig(
            actor_fc_layer_params=[256, 256], critic_fc_layer_params=[256, 256],
            actor_learning_rate=1e-3, critic_learning_rate=1e-3, alpha_learning_rate=1e-3,
            gamma=0.99, target_update_tau=0.005, initial_random_steps=1000),
        trainer=dict(num_envs=1, unroll_length=1, initial_collect_steps=1000,
                     num_updates_per_train_iter=1, mini_batch_size=256,
                     replay_buffer_length=20_000, eval_interval=1000)),
}
