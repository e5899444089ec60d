"""The configs of the algorithms Conduit started with: DQN, SAC and QR-SAC, PPO, A2C, DDPG
and TD3, and the random policy. :mod:`algorithms.configs` gathers them with the other families'
(``algorithms.config_<family>``) into one table; families may extend these classes (a variant
of SAC extends :class:`SoftActorCriticConfig`, one of PPO :class:`PpoConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from algorithms.config_base import (
    DISCOUNT,
    POSITIVE,
    UNIT,
    AlgorithmConfig,
    ConfigBase,
    hp,
)


@dataclass(frozen=True, kw_only=True)
class DqnConfig(AlgorithmConfig):
    """DQN / Double DQN with n-step targets (``algorithms.dqn``)."""

    algorithm: ClassVar[str] = "algorithms.dqn:DqnAlgorithm"
    name: Literal["dqn"] = hp("dqn", "algorithm name")
    fc_layer_params: list[int] = hp([256, 256], "hidden sizes of the Q network", range=POSITIVE)
    learning_rate: float = hp(1e-3, "Adam learning rate", range=POSITIVE)
    gamma: float = hp(0.99, "discount factor", range=DISCOUNT)
    n_step: int = hp(1, "length of the bootstrapped return (batches are n_step + 1 long)",
                     minimum=1)
    td_lambda: float = hp(1.0, "lambda of the target within the window (n_step > 1)",
                          range=UNIT)
    td_error_loss_fn: Literal["huber", "squared"] = hp("huber", "TD error loss")
    double_q: bool = hp(True, "pick the target action with the online network (Double DQN)")
    target_update_tau: float = hp(1.0, "soft-update factor of the target (1 = hard copy)",
                                  range=DISCOUNT)
    target_update_period: int = hp(100, "update the target every this many gradient steps",
                                   minimum=1)
    rollout_epsilon_greedy: float = hp(0.05, "final exploration epsilon", range=UNIT)
    epsilon_greedy_start: float = hp(1.0, "initial exploration epsilon", range=UNIT)
    epsilon_decay_steps: int = hp(10000, "env steps over which epsilon decays linearly",
                                  minimum=0)
    initial_random_steps: int = hp(0, "env steps with uniformly random actions", minimum=0)
    max_grad_norm: float | None = hp(10.0, "gradient clipping norm (null = off)",
                                     range=POSITIVE)


@dataclass(frozen=True, kw_only=True)
class SoftActorCriticConfig(AlgorithmConfig):
    """The fields SAC and its variants share (ALF's names), declared once."""

    actor_fc_layer_params: list[int] = hp([256, 256], "hidden sizes of the actor",
                                          range=POSITIVE)
    critic_fc_layer_params: list[int] = hp([256, 256], "hidden sizes of each critic",
                                           range=POSITIVE)
    actor_learning_rate: float = hp(3e-4, "Adam learning rate of the actor", range=POSITIVE)
    critic_learning_rate: float = hp(3e-4, "Adam learning rate of the critics",
                                     range=POSITIVE)
    alpha_learning_rate: float = hp(3e-4, "Adam learning rate of log_alpha", range=POSITIVE)
    gamma: float = hp(0.99, "discount factor", range=DISCOUNT)
    num_critic_replicas: int = hp(2, "number of critics; the target takes their minimum (per "
                                     "quantile in QR-SAC)", minimum=1)
    target_entropy: float | None = hp(None, "entropy target (null = -action_dim, or "
                                            "target_entropy_scale * log(n) for discrete)")
    initial_log_alpha: float = hp(0.0, "initial log_alpha")
    max_log_alpha: float | None = hp(None, "cap of log_alpha (null = no cap)")
    use_entropy_reward: bool = hp(True, "include -alpha * log pi in the target value")
    target_update_tau: float = hp(0.005, "soft-update factor of the target critics",
                                  range=DISCOUNT)
    target_update_period: int = hp(1, "soft-update every this many gradient steps", minimum=1)
    initial_random_steps: int = hp(0, "env steps with uniformly random actions", minimum=0)
    max_grad_norm: float | None = hp(None, "gradient clipping norm (null = off)",
                                     range=POSITIVE)


@dataclass(frozen=True, kw_only=True)
class SacConfig(SoftActorCriticConfig):
    """Soft Actor-Critic, continuous or discrete actions (``algorithms.sac``)."""

    algorithm: ClassVar[str] = "algorithms.sac:SacAlgorithm"
    name: Literal["sac"] = hp("sac", "algorithm name")
    mini_batch_length: int = hp(2, "replay window length T (2 = one-step targets)", minimum=2)
    td_lambda: float = hp(0.95, "lambda of the critic target when mini_batch_length > 2",
                          range=UNIT)
    td_error_loss_fn: Literal["huber", "squared"] = hp("squared", "TD error loss")
    target_entropy_scale: float = hp(0.5, "discrete default target entropy factor",
                                     range=POSITIVE)
    parallel_update: bool = hp(False, "run the actor's and the critics' halves of an update "
                                      "on two threads (continuous actions, learner "
                                      "num_threads 1; the same update)")


@dataclass(frozen=True, kw_only=True)
class QrsacConfig(SoftActorCriticConfig):
    """SAC with quantile-regression critics, continuous actions (``algorithms.qrsac``)."""

    algorithm: ClassVar[str] = "algorithms.qrsac:QrsacAlgorithm"
    name: Literal["qrsac"] = hp("qrsac", "algorithm name")
    num_quantiles: int = hp(50, "quantiles each critic outputs, at fractions (2i+1)/(2N)",
                            minimum=1)
    huber_kappa: float = hp(1.0, "kappa of the quantile Huber loss", range=POSITIVE)
    sum_over_quantiles: bool = hp(True, "sum the critic loss over the predicted quantiles "
                                        "(the paper's; false: average, ALF's default)")
    min_critic_by_critic_mean: bool = hp(False, "the replicas' minimum is the replica of the "
                                                "lowest mean (SAC's clipped double Q), not the "
                                                "minimum per quantile (ALF's default)")
    risk_measure: Literal["mean", "cvar"] = hp("mean", "the actor's value of the quantiles: "
                                                       "mean (risk-neutral) or cvar")
    risk_level: float = hp(0.25, "cvar's alpha: the mean of the lowest ceil(alpha * N) "
                                 "quantiles", range=DISCOUNT)


@dataclass(frozen=True, kw_only=True)
class PpoConfig(AlgorithmConfig):
    """PPO with the clipped surrogate objective (``algorithms.ppo``)."""

    algorithm: ClassVar[str] = "algorithms.ppo:PPOAlgorithm"
    on_policy: ClassVar[bool] = True
    name: Literal["ppo"] = hp("ppo", "algorithm name")
    actor_fc_layer_params: list[int] = hp([64, 64], "hidden sizes of the actor",
                                          range=POSITIVE)
    value_fc_layer_params: list[int] = hp([64, 64], "hidden sizes of the value network",
                                          range=POSITIVE)
    learning_rate: float = hp(3e-4, "Adam learning rate", range=POSITIVE)
    gamma: float = hp(0.99, "discount factor", range=DISCOUNT)
    td_lambda: float = hp(0.95, "lambda of GAE", range=UNIT)
    importance_ratio_clipping: float = hp(0.2, "epsilon of the clipped objective",
                                          range=POSITIVE)
    log_prob_clipping: float = hp(0.0, "clip log-probs to (-c, c) in the ratio (0 = off)",
                                  minimum=0.0)
    normalize_advantages: bool = hp(True, "normalize advantages per mini-batch")
    advantage_clip: float | None = hp(None, "clip advantages to [-x, x] (null = off)",
                                      range=POSITIVE)
    entropy_regularization: float = hp(0.0, "entropy coefficient", minimum=0.0)
    td_loss_weight: float = hp(0.5, "value-loss coefficient", minimum=0.0)
    num_epochs: int = hp(4, "passes over each unroll", minimum=1)
    mini_batch_size: int = hp(64, "samples per gradient step", minimum=1)
    max_grad_norm: float | None = hp(0.5, "gradient clipping norm (null = off)",
                                     range=POSITIVE)
    init_std: float = hp(1.0, "initial std of the Gaussian policy (continuous actions)",
                         range=POSITIVE)
    activation: Literal["tanh", "relu"] = hp("tanh", "activation after every hidden layer, "
                                                     "conv layers included")
    orthogonal_init: bool = hp(False, "orthogonal weights (gain sqrt 2; policy head 0.01, value "
                                      "head 1) and zero biases, else torch's default init")
    learning_rate_anneal_steps: int | None = hp(None, "trained env steps over which the "
                                                      "learning rate decays linearly to 0 "
                                                      "(null = constant)", minimum=1)
    shared_encoder_fc_layer_params: list[int] | None = hp(
        None, "null: separate actor and value networks; a list: one encoder plus these "
              "layers shared by both (CleanRL's Atari PPO: [512] with empty actor and value "
              "layers), half the convolutions of an image update", range=POSITIVE)
    rnn_size: int | None = hp(None, "hidden size of a GRU between the encoder and the heads: "
                                    "a recurrent policy trained on whole env columns of "
                                    "mini_batch_size // T each (null = feed-forward)",
                              minimum=1)


@dataclass(frozen=True, kw_only=True)
class A2cConfig(AlgorithmConfig):
    """Synchronous advantage actor-critic (``algorithms.actor_critic``)."""

    algorithm: ClassVar[str] = "algorithms.actor_critic:ActorCriticAlgorithm"
    on_policy: ClassVar[bool] = True
    name: Literal["a2c"] = hp("a2c", "algorithm name")
    actor_fc_layer_params: list[int] = hp([64, 64], "hidden sizes of the actor",
                                          range=POSITIVE)
    value_fc_layer_params: list[int] = hp([64, 64], "hidden sizes of the value network",
                                          range=POSITIVE)
    learning_rate: float = hp(7e-4, "Adam learning rate", range=POSITIVE)
    gamma: float = hp(0.99, "discount factor", range=DISCOUNT)
    use_gae: bool = hp(False, "GAE advantages instead of return - value")
    td_lambda: float = hp(0.95, "lambda of GAE", range=UNIT)
    use_td_lambda_return: bool = hp(True, "with GAE, train the value on the lambda-return")
    normalize_advantages: bool = hp(False, "normalize advantages over the unroll")
    advantage_clip: float | None = hp(None, "clip advantages to [-x, x] (null = off)",
                                      range=POSITIVE)
    entropy_regularization: float = hp(0.0, "entropy coefficient", minimum=0.0)
    td_loss_weight: float = hp(0.5, "value-loss coefficient", minimum=0.0)
    max_grad_norm: float | None = hp(0.5, "gradient clipping norm (null = off)",
                                     range=POSITIVE)
    init_std: float = hp(1.0, "initial std of the Gaussian policy (continuous actions)",
                         range=POSITIVE)
    shared_encoder_fc_layer_params: list[int] | None = hp(
        None, "null: separate actor and value networks; a list: one encoder plus these ReLU "
              "layers shared by both (CleanRL's Atari PPO: [512] with empty actor and value "
              "layers), half the convolutions of an image update", range=POSITIVE)


@dataclass(frozen=True, kw_only=True)
class DdpgConfig(AlgorithmConfig):
    """DDPG (``algorithms.ddpg``); TD3 is the same algorithm with :class:`Td3Config`."""

    algorithm: ClassVar[str] = "algorithms.ddpg:DdpgAlgorithm"
    name: Literal["ddpg"] = hp("ddpg", "algorithm name")
    actor_fc_layer_params: list[int] = hp([256, 256], "hidden sizes of the actor",
                                          range=POSITIVE)
    critic_fc_layer_params: list[int] = hp([256, 256], "hidden sizes of each critic",
                                           range=POSITIVE)
    actor_learning_rate: float = hp(1e-3, "Adam learning rate of the actor", range=POSITIVE)
    critic_learning_rate: float = hp(1e-3, "Adam learning rate of the critics",
                                     range=POSITIVE)
    gamma: float = hp(0.99, "discount factor", range=DISCOUNT)
    mini_batch_length: int = hp(2, "replay window length T (2 = one-step targets)", minimum=2)
    td_lambda: float = hp(0.95, "lambda of the critic target when mini_batch_length > 2",
                          range=UNIT)
    td_error_loss_fn: Literal["huber", "squared"] = hp("squared", "TD error loss")
    num_critic_replicas: int = hp(1, "number of critics; targets take their minimum",
                                  minimum=1)
    exploration_noise: Literal["ou", "gaussian"] = hp("ou", "rollout noise process")
    ou_stddev: float = hp(0.2, "stddev of the exploration noise", minimum=0.0)
    ou_damping: float = hp(0.15, "damping of the OU process", range=UNIT)
    rollout_random_action: float = hp(0.0, "probability of a uniformly random rollout action",
                                      range=UNIT)
    target_policy_noise: float = hp(0.0, "stddev of target policy smoothing (0 = off)",
                                    minimum=0.0)
    target_policy_noise_clip: float = hp(0.5, "clip of the smoothing noise", minimum=0.0)
    actor_update_period: int = hp(1, "update actor and targets every this many critic updates",
                                  minimum=1)
    target_update_tau: float = hp(0.005, "soft-update factor of the targets", range=DISCOUNT)
    target_update_period: int = hp(1, "soft-update every this many actor updates", minimum=1)
    dqda_clipping: float | None = hp(None, "clip dQ/da element-wise (null = off)",
                                     range=POSITIVE)
    action_l2: float = hp(0.0, "weight of the squared action norm in the actor loss",
                          minimum=0.0)
    initial_random_steps: int = hp(0, "env steps with uniformly random actions", minimum=0)
    max_grad_norm: float | None = hp(None, "gradient clipping norm (null = off)",
                                     range=POSITIVE)


@dataclass(frozen=True, kw_only=True)
class Td3Config(DdpgConfig):
    """TD3: DDPG with twin critics, target policy smoothing and delayed actor updates."""

    name: Literal["td3"] = hp("td3", "algorithm name")
    num_critic_replicas: int = hp(2, "number of critics; targets take their minimum",
                                  minimum=1)
    exploration_noise: Literal["ou", "gaussian"] = hp("gaussian", "rollout noise process")
    ou_stddev: float = hp(0.1, "stddev of the exploration noise", minimum=0.0)
    target_policy_noise: float = hp(0.2, "stddev of target policy smoothing (0 = off)",
                                    minimum=0.0)
    target_policy_noise_clip: float = hp(0.5, "clip of the smoothing noise", minimum=0.0)
    actor_update_period: int = hp(2, "update actor and targets every this many critic updates",
                                  minimum=1)


@dataclass(frozen=True, kw_only=True)
class RandomConfig(ConfigBase):
    """Uniformly random actions (measuring the pipeline; no parameters to wait for)."""

    algorithm: ClassVar[str] = "algorithms.random_policy:RandomPolicy"
    on_policy: ClassVar[bool] = False
    name: Literal["random"] = hp("random", "algorithm name")
    seed: int = hp(0, "seed of the action sampler")


CONFIGS = (DqnConfig, SacConfig, QrsacConfig, PpoConfig, A2cConfig, DdpgConfig, Td3Config,
           RandomConfig)
