"""ReplayBuffer against a naive pure-Python model, driven by random programs.

The model keeps every step ever written per environment in a list and answers each
question by the definition: which positions are stored, which may start a sequence,
what each step's episode begin/end is, what the n-step return is, what priority a slot
has and what its importance weight must be.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import ReplayBuffer, StepType, TensorSpec, arrays, nstep_returns

# (device, tree kernel, backend): fused numba, reference on numba trees, reference on torch;
# "cpu-torch-path": the bookkeeping and trees a GPU runs, on the CPU (storage.arrays).
DEVICES = [
    ("cpu", None, None),
    ("cpu", "numba", "reference"),
    ("cpu", "torch", None),
    ("cpu-torch-path", None, None),
    pytest.param(
        ("cuda", None, None),
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    ),
]
GAMMA = 0.5
SPEC = {
    "step_type": TensorSpec((), torch.int64),
    "reward": TensorSpec((), torch.float32),
    "discount": TensorSpec((), torch.float32),
    "observation": TensorSpec((2,), torch.float32),
}


class Model:
    def __init__(self, num_envs, max_length, nefi, initial_priority):
        self.num_envs, self.max_length, self.nefi = num_envs, max_length, nefi
        self.initial_priority = initial_priority
        self.history = [[] for _ in range(num_envs)]  # (step dict), index == position
        self.size = [0] * num_envs
        self.priority = {}  # (env, pos) -> priority, stored steps only
        self.cleared_at = [0] * num_envs  # first position after the latest clear

    def current(self, e):
        return len(self.history[e])

    def earliest(self, e):
        return self.current(e) - self.size[e]

    def stored(self, e, p):
        return self.earliest(e) <= p < self.current(e)

    def add(self, env_ids, steps):
        new_priority = max([self.initial_priority, *self.priority.values()])
        for e, step in zip(env_ids, steps, strict=True):
            pos = self.current(e)
            self.history[e].append(step)
            self.size[e] = min(self.size[e] + 1, self.max_length)
            self.priority.pop((e, pos - self.max_length), None)
            self.priority[(e, pos)] = new_priority

    def clear(self, env_ids):
        for e in env_ids:
            self.size[e] = 0
            self.cleared_at[e] = self.current(e)
            for key in [k for k in self.priority if k[0] == e]:
                del self.priority[key]

    def valid_starts(self, length):
        return {
            (e, p)
            for e in range(self.num_envs)
            for p in range(self.earliest(e) + self.nefi, self.current(e) - length + 1)
        }

    def episode_begin(self, e, p):
        q = p
        while q > self.cleared_at[e]:
            if self.history[e][q]["step_type"] == StepType.FIRST:
                return q
            if self.history[e][q - 1]["step_type"] == StepType.LAST:
                return q
            q -= 1
        return q

    def steps_to_end(self, e, p):
        q = p
        while q < self.current(e) - 1 and self.history[e][q]["step_type"] != StepType.LAST:
            q += 1
        return q - p

    def nstep(self, e, p, n):
        ret, factor, steps = 0.0, 1.0, 0
        for k in range(1, n + 1):
            if p + k >= self.current(e) or self.history[e][p + k - 1]["step_type"] == StepType.LAST:
                break
            step = self.history[e][p + k]
            ret += factor * step["reward"]
            factor *= GAMMA * step["discount"]
            steps = k
        return ret, (factor if steps else 0.0), steps


@st.composite
def programs(draw):
    num_envs = draw(st.integers(1, 3))
    max_length = draw(st.integers(1, 7))
    nefi = draw(st.integers(0, 1))
    prioritized = draw(st.booleans())
    ops = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("add"), st.sets(st.integers(0, num_envs - 1), min_size=1)),
                st.tuples(st.just("add"), st.sets(st.integers(0, num_envs - 1), min_size=1)),
                st.tuples(st.just("sample"), st.integers(1, 6), st.integers(1, 3)),
                st.tuples(st.just("priority"), st.integers(0, 5)),
                st.tuples(st.just("clear"), st.sets(st.integers(0, num_envs - 1))),
            ),
            min_size=5,
            max_size=35,
        )
    )
    return num_envs, max_length, nefi, prioritized, ops


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=40, deadline=None)
@given(program=programs(), data=st.data())
def test_buffer_matches_model(device, program, data):
    device, tree_backend, backend = device
    if device == "cpu-torch-path":
        device = "cpu"
        arrays.TORCH_ON_CPU = True  # read when the buffer is built (a fixture would outlive
        try:                        # one hypothesis example)
            return _buffer_matches_model(device, None, None, program, data)
        finally:
            arrays.TORCH_ON_CPU = False
    return _buffer_matches_model(device, tree_backend, backend, program, data)


def _buffer_matches_model(device, tree_backend, backend, program, data):
    num_envs, max_length, nefi, prioritized, ops = program
    rb = ReplayBuffer(
        SPEC,
        num_envs,
        max_length,
        num_earliest_frames_ignored=nefi,
        prioritized_sampling=prioritized,
        keep_episodic_info=True,
        device=device,
        seed=0,
        backend=backend,
        tree_backend=tree_backend,
    )
    model = Model(num_envs, max_length, nefi, initial_priority=1.0)
    phase = [0] * num_envs  # steps into the current episode
    sampled = []
    length = 1
    for op in ops:
        if op[0] == "add":
            env_ids = sorted(op[1])
            steps = []
            for e in env_ids:
                if phase[e] == 0 or (model.current(e) and model.history[e][-1]["step_type"] == 2):
                    step_type = StepType.FIRST
                else:
                    step_type = data.draw(st.sampled_from([StepType.MID, StepType.LAST]))
                discount = 0.0 if step_type == StepType.LAST and data.draw(st.booleans()) else 1.0
                reward = float(data.draw(st.integers(-2, 2)))
                phase[e] = 0 if step_type == StepType.LAST else phase[e] + 1
                steps.append({"step_type": int(step_type), "reward": reward, "discount": discount})
            batch = {
                "step_type": torch.tensor([s["step_type"] for s in steps]),
                "reward": torch.tensor([s["reward"] for s in steps]),
                "discount": torch.tensor([s["discount"] for s in steps]),
                "observation": torch.tensor([[float(e), float(model.current(e))] for e in env_ids]),
            }
            rb.add_batch(batch, torch.tensor(env_ids))
            model.add(env_ids, steps)
            for e in env_ids:
                phase[e] = phase[e] if steps else 0
        elif op[0] == "sample":
            batch_size, length = op[1], op[2]
            valid = model.valid_starts(length)
            if prioritized:  # a start whose priority is 0 has weight 0: never drawn
                valid = {k for k in valid if model.priority[k] > 0}
            if not valid:
                with pytest.raises(ValueError):
                    rb.get_batch(batch_size, length)
                continue
            out, info = rb.get_batch(batch_size, length)
            env_ids, positions = info.env_ids.tolist(), info.positions.tolist()
            for b, (e, p) in enumerate(zip(env_ids, positions, strict=True)):
                assert (e, p) in valid
                obs = out["observation"][b].tolist()
                assert obs == [[float(e), float(p + t)] for t in range(length)]
                assert out["reward"][b].tolist() == [
                    model.history[e][p + t]["reward"] for t in range(length)
                ]
            if prioritized:  # ALF's N * P(i): priority over the mean non-zero priority
                mean = sum(model.priority[k] for k in valid) / len(valid)
                expected = [
                    model.priority[(e, p)] / mean for e, p in zip(env_ids, positions, strict=True)
                ]
                assert info.importance_weights.tolist() == pytest.approx(expected, rel=1e-5)
            sampled.extend(zip(env_ids, positions, strict=True))
        elif op[0] == "priority" and prioritized and sampled:
            chosen = data.draw(st.lists(st.sampled_from(sampled), min_size=1, max_size=4))
            values = [float(op[1] + i) for i in range(len(chosen))]
            applied = rb.update_priority(
                torch.tensor([e for e, _ in chosen]),
                torch.tensor([p for _, p in chosen]),
                torch.tensor(values),
            )
            for (e, p), v, ok in zip(chosen, values, applied.tolist(), strict=True):
                assert ok == model.stored(e, p)
                if ok:
                    model.priority[(e, p)] = v
            future = data.draw(st.integers(0, num_envs - 1))
            with pytest.raises(ValueError):
                rb.update_priority(
                    torch.tensor([future]), torch.tensor([model.current(future)]), torch.ones(1)
                )
        elif op[0] == "clear":
            rb.clear(torch.tensor(sorted(op[1]), dtype=torch.int64))
            model.clear(sorted(op[1]))
            for e in op[1]:
                phase[e] = 0

        # --- invariants after every operation
        assert int(rb.total_size) == sum(model.size)
        valid = model.valid_starts(rb.sampler.batch_length)
        leaves = rb.sampler.sum_tree.leaves().cpu()
        for e in range(num_envs):
            for p in range(max(0, model.current(e) - max_length), model.current(e)):
                slot = e * max_length + p % max_length
                weight = model.priority.get((e, p)) if prioritized else 1.0
                want = weight if (e, p) in valid else 0.0
                if model.stored(e, p) or (e, p) not in valid:
                    assert float(leaves[slot]) == want, (e, p)
        stored = [
            (e, p) for e in range(num_envs) for p in range(model.earliest(e), model.current(e))
        ]
        if stored:
            envs = torch.tensor([e for e, _ in stored])
            pos = torch.tensor([p for _, p in stored])
            assert rb.get_episode_begin_position(pos, envs).tolist() == [
                model.episode_begin(e, p) for e, p in stored
            ]
            assert rb.steps_to_episode_end(pos, envs).tolist() == [
                model.steps_to_end(e, p) for e, p in stored
            ]
            result = nstep_returns(rb, envs, pos, 3, GAMMA)
            expected = [model.nstep(e, p, 3) for e, p in stored]
            assert result.returns.tolist() == pytest.approx([x[0] for x in expected])
            assert result.bootstrap_discount.tolist() == pytest.approx([x[1] for x in expected])
            assert result.steps.tolist() == [x[2] for x in expected]
