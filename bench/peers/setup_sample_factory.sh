#!/usr/bin/env bash
# Builds bench/.venv-sf: Sample Factory 2.1.1 with EnvPool 1.2.5 (Atari Breakout) for
# bench/peers/sample_factory_appo.py, in its own virtual environment (never the project's).
#
#     bash bench/peers/setup_sample_factory.sh     # PYTHON=python3.11 SF_VENV=dir to override
#
# The same torch as the project (2.13.0, the CPU build on this disk) and Gymnasium 0.29.1, which
# Sample Factory 2.1.1 expects. EnvPool 1.2.5's Gymnasium wrapper skips VectorEnv's constructor,
# so the `closed` and `viewer` attributes that 0.29.1's VectorEnv.close reads are missing and the
# run fails at exit: the peer's own copy of gymnasium is patched to tolerate that (never the
# project's).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${SF_VENV:-$here/../.venv-sf}
python=${PYTHON:-python3.11}
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" torch==2.13.0 "numpy<2" gymnasium==0.29.1 sample-factory==2.1.1 envpool==1.2.5 \
    opencv-python-headless
# The patches below edit installed files: a second run starts from the released copies.
"${pip[@]}" --force-reinstall --no-deps gymnasium==0.29.1 sample-factory==2.1.1
site=$("$venv/bin/python" -c "import gymnasium, os; print(os.path.dirname(gymnasium.__file__))")
"$venv/bin/python" - "$site/vector/vector_env.py" <<'PY'
import sys
path = sys.argv[1]
src = open(path).read()
old = "        if self.closed:\n            return"
new = "        if getattr(self, 'closed', False):\n            return"
if old in src:
    src = src.replace(old, new)
if "if hasattr(self, 'close_extras')" not in src:  # once: the new text holds the old
    src = src.replace("self.close_extras(**kwargs)\n        self.closed = True",
                      "if hasattr(self, 'close_extras'):\n            self.close_extras(**kwargs)\n"
                      "        self.closed = True")
src = src.replace("if self.viewer is not None:", "if getattr(self, 'viewer', None) is not None:")
open(path, "w").write(src)
PY
# Sample Factory's EnvPoolResetFixWrapper resets every env whose episode ended, and with
# episodic_life a lost life ends one: each life then restarts the game (a fresh wall, 5 lives
# again), so the peer would only ever play first lives. Its copy resets at game over (lives 0) or
# truncation instead, as EnvPool's own autoreset and Conduit's runner do: both sides then play
# whole games whose lost lives end the learner's episodes.
sf=$("$venv/bin/python" -c "import sf_examples, os; print(os.path.dirname(sf_examples.__file__))")
"$venv/bin/python" - "$sf/envpool/envpool_wrappers.py" <<'PY'
import sys
path = sys.argv[1]
src = open(path).read()
old = "needs_reset = np.nonzero(terminated | truncated)[0]"
new = "needs_reset = np.nonzero((terminated & (info['lives'] == 0)) | truncated)[0]"
if old in src:
    src = src.replace(old, new)
assert new in src, "EnvPoolResetFixWrapper changed: check the game-over reset patch"
open(path, "w").write(src)
PY
"$venv/bin/python" -c "import sample_factory, envpool, torch; print('sample-factory ready:', sample_factory.__version__ if hasattr(sample_factory, '__version__') else '2.1.1', 'envpool', envpool.__version__, 'torch', torch.__version__)"
