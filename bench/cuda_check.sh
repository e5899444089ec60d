#!/usr/bin/env bash
# The CUDA paths on a machine with a GPU: the CUDA tests, then short graph runs with the
# learner, the replay store, the unroller and the actor on the GPU. About 7 minutes on one H100.
#
#   bash bench/cuda_check.sh            # with the project's dependencies importable
#
# Prints each graph's evaluations and the learner's update time (learner/train_ms_per_update);
# a run that reaches its duration before its threshold exits 1, which is expected for the
# MinAtar run (it is cut short). Latest results (2026-11-27, e713899, one H100):
# docs/benchmarks.md, "GPU".
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
runs=$(mktemp -d)

summary() {
    "$PY" - "$1" <<'PYCODE'
import json, sys
for line in open(sys.argv[1] + "/metrics.jsonl"):
    m = json.loads(line)
    if "eval/return" in m:
        print(f"  eval   env_steps={m['env_steps']} return={m['eval/return']:.1f}")
    if "learner/train_ms_per_update" in m:
        print(f"  update env_steps={m['env_steps']} train_ms={m['learner/train_ms_per_update']:.2f}"
              f" updates_per_s={m['learner/updates_per_s']:.0f}")
PYCODE
    grep -h "Traceback" "$1"/logs/*.log | head -3
}

graph() {  # name, timeout, run.py arguments...
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    timeout "$limit" "$PY" run.py run --quiet --run-dir "$runs/$name" "$@"
    echo "  exit code $?"
    summary "$runs/$name" | tail -8
}

echo "== CUDA tests"
"$PY" -m pytest -q -p no:cacheprovider -k cuda tests/test_alg_interface.py \
    tests/test_storage_replay_buffer.py tests/test_storage_replay_model.py \
    tests/test_storage_segment_tree.py tests/test_alg_precision.py \
    tests/test_alg_sac_parallel.py 2>&1 | tail -15
graph sac 90 graphs/sac_pendulum.yaml --set nodes.learner.device=cuda
graph dqn_per 240 graphs/dqn_cartpole_per.yaml --set nodes.learner.device=cuda \
    --set nodes.replay_store.device=cuda
graph ppo 100 graphs/ppo_cartpole.yaml --set nodes.learner.device=cuda \
    --set nodes.unroller.device=cuda
graph dqn_actor 90 graphs/dqn_cartpole_actor.yaml --set nodes.learner.device=cuda \
    --set nodes.actor.device=cuda
graph minatar 70 graphs/dqn_minatar.yaml --set nodes.learner.device=cuda \
    --set nodes.replay_store.device=cuda --set run.duration_s=45
rm -rf "$runs"
