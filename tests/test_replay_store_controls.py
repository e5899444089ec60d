"""Replay controls from the graph reach the buffer: real ``run.py``, real processes and sockets.

A small DQN-CartPole graph runs to a short env-step budget with the controls set in the
``replay_store`` config; what the store did is read back from its ``replay/...`` metrics
(the buffer's own statistics, draw by draw) and from the description of the buffer it built
(in ``summary.json``). Config mistakes are checked at load, before any process starts.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline import graph as graphlib
from tests.pipeline_harness import ROOT, LiveRun

GRAPH = """\
name: replay_controls
agent:
  env_id: CartPole-v1
  algorithm:
    name: dqn
    fc_layer_params: [32]
    learning_rate: 0.001
    gamma: 0.99
    target_update_period: 64
    epsilon_decay_steps: 1000
topics:
  experience: {{delivery: reliable, hwm: 256}}
  params: {{delivery: latest, hwm: 4}}
  metrics: {{delivery: reliable, hwm: 10000}}
{priorities_topic}nodes:
  env_runner:
    kind: env_runner
    config: {{num_envs: 4, seed: 0}}
    calls: [policy]
    publishes: [metrics]
  unroller:
    kind: unroller
    config: {{seed: 0}}
    serves: [policy]
    subscribes: [params]
    publishes: [experience]
  replay_store:
    kind: replay_store
    config:
      num_environments: 4
      max_length: 2000
      min_size_to_sample: 400
      samples_per_insert: 8
      spi_tolerance: 2048
      metrics_interval_s: 0.5
{replay}
    subscribes: [experience{priorities_in}]
    serves: [sample]
    publishes: [metrics]
  learner:
    kind: learner
    config:
      num_env_steps: {budget}
      mini_batch_size: 32
      publish_params_every: {publish_every}
      prioritized: {prioritized}
      metrics_interval_s: 0.5
    calls: [sample]
    publishes: [params, metrics{priorities_out}]
  metrics_sink:
    kind: metrics_sink
    subscribes: [metrics]
run:
  stop_when: [learner]
  duration_s: 600
"""


def write_graph(tmp_path, replay: dict, budget=4000, publish_every=8, prioritized=False):
    lines = "\n".join(f"      {k}: {v}" for k, v in replay.items())
    text = GRAPH.format(
        replay=lines, budget=budget, publish_every=publish_every,
        prioritized=str(prioritized).lower(),
        priorities_topic="  priorities: {delivery: reliable, hwm: 256}\n" if prioritized else "",
        priorities_in=", priorities" if prioritized else "",
        priorities_out=", priorities" if prioritized else "",
    )
    path = tmp_path / "replay_controls.yaml"
    path.write_text(text)
    return str(path)


@pytest.fixture
def live(live_runs):
    return live_runs


def replay_reports(run: LiveRun) -> list[dict]:
    return [m for m in run.metrics() if m.get("source", "").startswith("replay_store")
            or "replay/size" in m]


def finished(run: LiveRun) -> dict:
    assert run.finish(500) == 0, run.stderr
    summary = run.summary()
    assert summary["failure"] is None, summary["failure"]
    return summary["nodes"]


@pytest.mark.timeout(600)
def test_uniform_controls_reach_the_buffer(live, tmp_path):
    graph = write_graph(tmp_path, {
        "max_use": 3, "max_staleness": 2, "sample_statistics": "true",
        "throughput_period_s": 0.2, "ere_eta": 0.9, "ere_cmin": 400, "ere_round": 20,
        "num_earliest_frames_ignored": 5, "nstep": 3, "nstep_gamma": 0.9,
        "record_episodic_return": "true", "episodic_gamma": 0.9, "default_return": -1000.0,
    }, publish_every=8)
    run = live(graph)
    nodes = finished(run)
    buffer = nodes["replay_store.0"]["status"]["buffer"]
    assert buffer["controls"] == ["max_staleness", "max_use", "sample_statistics", "throughput"]
    assert buffer["num_earliest_frames_ignored"] == 5
    assert buffer["episodic"] and buffer["ere"] and buffer["nstep"] == 3
    # The learner's versions grew past max_staleness at 1/8 of its iterations: had staleness
    # been counted in iterations, nothing would have stayed fresh enough and the learner
    # would have waited for samples until the run's duration.
    learner = nodes["learner.0"]["status"]
    assert learner["version"] > 4 and learner["iteration"] >= 8 * learner["version"] - 8

    reports = [r for r in replay_reports(run) if "replay/use_max" in r]
    assert reports, "no sample statistics published"
    # No slot was drawn again once used 3 times (one draw may repeat a slot when few are
    # valid, so use_max itself may pass 3).
    assert max(r["replay/use_before_max"] for r in reports) < 3
    assert max(r["replay/staleness_max"] for r in reports) <= 2
    assert max(r["replay/staleness_max"] for r in reports) >= 1  # not trivially fresh
    assert min(r["replay/start_offset_min"] for r in reports) >= 5  # earliest frames ignored
    rates = [r for r in reports if "replay/pushed_per_s" in r]
    assert rates and max(r["replay/pushed_per_s"] for r in rates) > 0
    assert max(r["replay/removed_per_s"] for r in rates) > 0  # evictions were counted
    # ERE: windows shrink below the whole buffer, and samples come from inside them.
    assert any(r["replay/ere_window"] < r["replay/size"] for r in reports)
    # m <= n steps: fewer at an episode's end or at the newest stored step, 0 for a start
    # that is itself LAST. Here 8 samples per insert outrun 3 uses per step, so once the
    # older steps are used up every draw starts one step before the newest (m = 1): how
    # soon depends on the machine's speed, so that m spans several steps is shown below,
    # in a run whose buffer is never drawn dry.
    assert all(0.0 <= r["replay/nstep_steps_mean"] <= 3.0 for r in reports)
    assert any("replay/episode_return_mean" in r for r in reports)
    assert all(r["replay/episode_return_mean"] > 0 for r in reports
               if "replay/episode_return_mean" in r)  # CartPole pays +1 per step


@pytest.mark.timeout(600)
def test_nstep_returns_span_several_steps_of_an_undrained_buffer(live, tmp_path):
    """Without max_use or staleness nothing is evicted before it is overwritten, so uniform
    starts lie anywhere in the buffer and most see all 3 steps after them (fewer only in an
    episode's last 3 steps): the mean over any report is 2.4-3 however fast the learner draws.
    With n-step off there is no report, and with n = 1 it is at most 1."""
    graph = write_graph(tmp_path, {"nstep": 3, "nstep_gamma": 0.9}, budget=2000)
    run = live(graph)
    nodes = finished(run)
    assert nodes["replay_store.0"]["status"]["buffer"]["nstep"] == 3
    steps = [r["replay/nstep_steps_mean"] for r in replay_reports(run)
             if "replay/nstep_steps_mean" in r]
    assert steps and all(1.5 < s <= 3.0 for s in steps), steps


@pytest.mark.timeout(600)
def test_prioritized_replay_anneals_beta_in_a_sample_range(live, tmp_path):
    graph = write_graph(tmp_path, {
        "prioritized_sampling": "true", "priority_replay_alpha": 0.6,
        "priority_replay_eps": 0.01, "beta_start": 0.4, "beta_anneal_samples": 8000,
        "sample_range": "[-100, null]",
    }, prioritized=True, budget=3000)
    run = live(graph)
    nodes = finished(run)
    assert nodes["replay_store.0"]["status"]["buffer"]["prioritized"]
    assert nodes["replay_store.0"]["status"]["priority_updates"] > 0
    reports = [r for r in replay_reports(run) if "replay/beta" in r]
    betas = [r["replay/beta"] for r in reports]
    assert betas[0] >= 0.4 and betas == sorted(betas) and betas[-1] <= 1.0
    assert betas[-1] > betas[0]
    ages = [r["replay/start_age_max"] for r in reports if "replay/start_age_max" in r]
    assert ages and max(ages) < 100  # every start among each env's newest 100 steps


MISTAKES = [
    ({"sample_range": "[-100, null]", "ere_eta": 0.9}, "sample_range: and ere_eta both"),
    ({"beta_anneal_samples": 1000}, "beta_anneal_samples: needs prioritized_sampling"),
    ({"num_earliest_frames_ignored": 5000}, "num_earliest_frames_ignored: must be below"),
    ({"beta_start": 1.5}, "beta_start: must lie in [0, 1]"),
    ({"max_use": 0}, "max_use: must be >= 1"),
    ({"sample_range": "[1, 2, 3]"}, "sample_range: must be [start, stop]"),
]


@pytest.mark.parametrize("replay,message", MISTAKES)
def test_config_mistakes_are_one_line_at_load(tmp_path, replay, message):
    """Each mistake, as the graph's load reports it (what run.py prints, below)."""
    with pytest.raises(graphlib.GraphError) as info:
        graphlib.load(write_graph(tmp_path, replay))
    text = str(info.value)
    assert len(text.splitlines()) == 1 and message in text and "replay_controls.yaml:" in text, \
        text


def test_a_config_mistake_is_one_line_from_run_py_and_exit_2(tmp_path):
    replay, message = MISTAKES[0]
    graph = write_graph(tmp_path, replay)
    result = subprocess.run([sys.executable, os.path.join(ROOT, "run.py"), "run", graph,
                             "--run-dir", str(tmp_path / "run")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "replay_controls.yaml:" in lines[0], \
        result.stderr
