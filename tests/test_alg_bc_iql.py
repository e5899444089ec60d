"""BC's and IQL's losses against values computed by hand, their masking of LAST steps, and
that each network is moved only by its own loss."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import algorithms
from algorithms.bc import bc_continuous_loss, bc_discrete_loss
from algorithms.config_offline import BcConfig, IqlConfig
from algorithms.data import Experience, StepType
from algorithms.iql import expectile_loss, iql_losses

OBS = gym.spaces.Box(-1, 1, (3,), np.float32)
BOX = gym.spaces.Box(-2, 2, (1,), np.float32)


def test_expectile_loss_weighs_under_and_over_estimates_apart():
    # diff = target - prediction: 2 (V too low) weighs tau, -1 (V too high) weighs 1 - tau.
    got = expectile_loss(torch.tensor([2.0, -1.0, 0.0]), 0.8)
    torch.testing.assert_close(got, torch.tensor([0.8 * 4, 0.2 * 1, 0.0]))
    # tau = 0.5 is half the squared error: the mean, not an upper expectile.
    torch.testing.assert_close(expectile_loss(torch.tensor([3.0, -3.0]), 0.5),
                               torch.tensor([4.5, 4.5]))


def _case(**overrides):
    args = dict(q=torch.tensor([[1.0, 2.0], [0.0, 0.0]]), q_target=torch.tensor([1.5, -1.0]),
                value=torch.tensor([1.0, 0.0]), next_value=torch.tensor([2.0, 4.0]),
                reward=torch.tensor([1.0, -1.0]), discount=torch.tensor([1.0, 0.0]),
                log_prob=torch.tensor([-1.0, -2.0]), valid=torch.tensor([1.0, 1.0]),
                gamma=0.5, expectile=0.8, temperature=2.0, max_exp_advantage=100.0)
    args.update(overrides)
    return iql_losses(**args)


def test_iql_losses_by_hand():
    out = _case()
    # target = r + gamma * d * V(s') = [1 + 0.5 * 1 * 2, -1 + 0.5 * 0 * 4] = [2, -1]
    # critic: sum over replicas of (target - Q_i)^2 = [(2-1)^2 + (2-2)^2, 2 * (-1-0)^2]
    torch.testing.assert_close(out["critic"], torch.tensor([1.0, 2.0]))
    # value: Q_t - V = [0.5, -1] -> [0.8 * 0.25, 0.2 * 1]
    torch.testing.assert_close(out["value"], torch.tensor([0.2, 0.2]))
    # actor: -exp(A / temperature) * log pi = -exp([0.25, -0.5]) * [-1, -2]
    torch.testing.assert_close(out["weight"], torch.tensor([math.exp(0.25), math.exp(-0.5)]))
    torch.testing.assert_close(out["actor"],
                               torch.tensor([math.exp(0.25), 2 * math.exp(-0.5)]))
    torch.testing.assert_close(out["td_error"], torch.tensor([[1.0, 0.0], [-1.0, -1.0]]))


def test_iql_clips_the_weight_and_masks_last_steps():
    out = _case(max_exp_advantage=1.1, valid=torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(out["weight"], torch.tensor([1.1, math.exp(-0.5)]))
    torch.testing.assert_close(out["actor"], torch.tensor([1.1, 0.0]))
    for name in ("critic", "value", "actor"):
        assert float(out[name][1]) == 0.0, name


def test_bc_losses_by_hand():
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    got = bc_discrete_loss(logits, torch.tensor([1, 0]), torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(got, torch.tensor([-math.log(0.75), -math.log(0.25)]))
    got = bc_continuous_loss(torch.tensor([[0.5, -1.0], [0.0, 0.0]]),
                             torch.tensor([[1.0, 1.0], [3.0, 3.0]]), torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(got, torch.tensor([0.25 + 4.0, 0.0]))


def _windows(action_space, b=32, t=2, last_at=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    step_type = torch.full((b, t), int(StepType.MID))
    if last_at is not None:
        step_type[:, last_at] = int(StepType.LAST)
    if isinstance(action_space, gym.spaces.Discrete):
        action = torch.randint(0, int(action_space.n), (b, t), generator=g)
    else:
        action = torch.rand(b, t, *action_space.shape, generator=g) * 4 - 2
    return Experience(step_type=step_type, reward=torch.randn(b, t, generator=g),
                      discount=torch.ones(b, t), observation=torch.rand(b, t, 3, generator=g),
                      action=action)


def _moved(alg, before) -> set[str]:
    return {k.split(".")[0] for k, v in alg.state_dict().items()
            if v.is_floating_point() and not torch.equal(v, before[k])}


def test_iql_update_moves_every_network_and_a_last_step_trains_nothing():
    alg = algorithms.make(IqlConfig(actor_fc_layer_params=[16], critic_fc_layer_params=[16],
                                    value_fc_layer_params=[16]), OBS, BOX)
    before = {k: v.clone() for k, v in alg.state_dict().items()}
    alg.train_on(_windows(BOX, last_at=0))  # every window starts at LAST: nothing to learn
    assert _moved(alg, before) == set()
    alg.train_on(_windows(BOX))
    assert _moved(alg, before) == {"actor_network", "critic_networks", "value_network",
                                   "target_critic_networks"}


def test_iql_actor_learning_rate_decays_on_a_cosine_and_stops_the_actor_at_its_end():
    """The schedule is the one each update uses (read back from the optimizer), it follows
    ``lr * (1 + cos(pi * k / K)) / 2``, and after ``K`` updates the actor no longer moves
    while the critics and the value still train."""
    config = IqlConfig(actor_fc_layer_params=[16], critic_fc_layer_params=[16],
                       value_fc_layer_params=[16], actor_learning_rate=1e-3,
                       actor_lr_decay_updates=4)
    alg = algorithms.make(config, OBS, BOX)
    used = []
    for k in range(4):
        alg.train_on(_windows(BOX, seed=k))
        used.append(alg.optimizers["actor"].param_groups[0]["lr"])
    assert used == pytest.approx([1e-3 * 0.5 * (1 + math.cos(math.pi * k / 4))
                                  for k in range(4)])
    before = {k: v.clone() for k, v in alg.state_dict().items()}
    alg.train_on(_windows(BOX, seed=9))
    assert alg.optimizers["actor"].param_groups[0]["lr"] == 0.0
    assert _moved(alg, before) == {"critic_networks", "value_network", "target_critic_networks"}


def test_iql_value_follows_the_expectile():
    """Only V trains (the critics' and actor's rates are 0): V(s) of one state with target
    values 0 and 1 goes to the expectile tau of {0, 1}: tau."""
    config = IqlConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8],
                       value_fc_layer_params=[8], value_learning_rate=0.05,
                       critic_learning_rate=1e-12, actor_learning_rate=1e-12, expectile=0.9)
    alg = algorithms.make(config, OBS, BOX)
    obs = torch.zeros(2, 3)
    action = torch.tensor([[-1.0], [1.0]])
    with torch.no_grad():  # target critics that say 0 for action -1 and 1 for action +1
        q = alg.target_critic_networks(obs, action).min(1).values
    for _ in range(150):
        info = alg.train_step(Experience(
            step_type=torch.ones(2, 2, dtype=torch.int64), reward=torch.zeros(2, 2),
            discount=torch.ones(2, 2), observation=torch.zeros(2, 2, 3),
            action=torch.stack([action, action], 1))).info
        info["q_target"] = torch.tensor([0.0, 1.0])
        loss = alg.calc_loss(info)
        alg.update_with_gradient(loss)
    assert q.shape == (2,)
    with torch.no_grad():
        v = float(alg.value_network(torch.zeros(1, 3)))
    assert v == pytest.approx(0.9, abs=0.05)


@pytest.mark.parametrize("space", [gym.spaces.Discrete(3), BOX], ids=["discrete", "box"])
def test_bc_copies_a_policy(space):
    """Actions that are a function of the observation are learned back."""
    alg = algorithms.make(BcConfig(actor_fc_layer_params=[32], actor_learning_rate=1e-2),
                          OBS, space)
    g = torch.Generator().manual_seed(0)

    def teacher(obs):
        if isinstance(space, gym.spaces.Discrete):
            return (obs[..., 0] > 0).long() + (obs[..., 1] > 0).long()
        return obs[..., :1] * 1.5

    for _ in range(150):
        obs = torch.rand(64, 1, 3, generator=g) * 2 - 1
        alg.train_on(Experience(step_type=torch.ones(64, 1, dtype=torch.int64),
                                reward=torch.zeros(64, 1), discount=torch.ones(64, 1),
                                observation=obs, action=teacher(obs)))
    obs = torch.rand(256, 3, generator=g) * 2 - 1
    with torch.no_grad():
        out = alg.actor_network(obs)
    if isinstance(space, gym.spaces.Discrete):
        assert float((out.argmax(-1) == teacher(obs)).float().mean()) > 0.9
    else:
        assert float((out - teacher(obs)).abs().mean()) < 0.1


def test_iql_refuses_discrete_actions():
    with pytest.raises(ValueError, match="continuous"):
        algorithms.make(IqlConfig(), OBS, gym.spaces.Discrete(2))
