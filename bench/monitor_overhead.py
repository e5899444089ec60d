"""Does watching a run slow it down? The demo graph's rate with and without monitors.

    python bench/monitor_overhead.py [--count 200000] [--repeats 2]

Runs ``graphs/demo_counter.yaml`` (source -> transformer -> sink on reliable topics) with
``--count`` records, alternately bare and with two monitors attached the whole time: one
``run.py monitor RUN --topic numbers`` printing every record it gets from the tap, and one
``run.py monitor RUN`` refreshing the status table every 0.5 s. The rate is records over the
time from the source's start to the sink's exit (``events.jsonl``). Prints both rates and, as the
last line, one JSON object with the ratio watched / bare (the issue's bar: >= 0.9).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pipeline.cli import control  # noqa: E402


def one_run(count: int, watched: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        proc = subprocess.Popen(
            [sys.executable, "run.py", "run", "graphs/demo_counter.yaml", "--run-dir", run_dir,
             "--quiet", "--set", f"nodes.source.config.count={count}",
             "--set", f"nodes.sink.config.expected={count}"],
            cwd=ROOT, stderr=subprocess.PIPE, text=True)
        monitors = []
        for line in proc.stderr:
            if line.startswith("control: "):
                break
        if watched:
            control(run_dir, "wait_ready", node="sink", timeout=120)
            for extra in (["--topic", "numbers"], ["--interval", "0.5"]):
                monitors.append(subprocess.Popen(
                    [sys.executable, "run.py", "monitor", run_dir, *extra], cwd=ROOT,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        proc.communicate(timeout=1200)
        for m in monitors:
            m.kill()
            m.wait()
        times = {}
        with open(os.path.join(run_dir, "events.jsonl")) as f:
            for line in f:
                event = json.loads(line)
                times.setdefault(event["topic"], event["t"])
        elapsed = times["supervisor.sink.exited"] - times["supervisor.source.started"]
        with open(os.path.join(run_dir, "sink_result.json")) as f:
            assert json.load(f)["missing"] == 0
        return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    bare, watched = [], []
    for i in range(args.repeats):
        bare.append(one_run(args.count, False))
        watched.append(one_run(args.count, True))
        print(f"round {i + 1}: bare {bare[-1]:.0f} rec/s, watched {watched[-1]:.0f} rec/s",
              flush=True)
    b, w = max(bare), max(watched)
    print(f"best: bare {b:.0f} rec/s, with monitors {w:.0f} rec/s, ratio {w / b:.3f}")
    print(json.dumps({"bench": "monitor_overhead", "count": args.count, "bare": round(b, 1),
                      "watched": round(w, 1), "ratio": round(w / b, 3), "target": 0.9}))


if __name__ == "__main__":
    main()
