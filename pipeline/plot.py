"""``run.py plot``: metrics of one or more runs as a PNG, for comparing runs.

Reads each run's ``metrics.jsonl`` (one JSON object per metrics message, with ``env_steps`` and
wall ``time``) and draws every metric whose name matches ``pattern`` (by default the returns)
against environment steps and against wall-clock time since the run's first record.
"""

from __future__ import annotations

import json
import os
import re


def read_metrics(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        raise ValueError(f"{run_dir}: no metrics.jsonl (did the graph have a metrics_sink?)")
    records = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if line_no > 1:  # a line cut by a crash at the end is fine; skip it
                    continue
                raise ValueError(f"{path}:{line_no}: not JSON") from None
    return records


def series(records: list[dict], name: str) -> tuple[list, list, list]:
    start = min((r["time"] for r in records), default=0.0)
    points = [(r["env_steps"], r["time"] - start, r[name]) for r in records if name in r]
    points.sort()
    return [p[0] for p in points], [p[1] for p in points], [p[2] for p in points]


def plot_runs(run_dirs: list[str], out: str, pattern: str = r"return$") -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {d: read_metrics(d) for d in run_dirs}
    names = sorted({k for records in runs.values() for r in records for k in r
                    if re.search(pattern, k)})
    if not names:
        raise ValueError(f"no metric matching {pattern!r} in {', '.join(run_dirs)}")
    fig, axes = plt.subplots(len(names), 2, figsize=(12, 3.5 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        for run_dir, records in runs.items():
            steps, seconds, values = series(records, name)
            label = os.path.basename(os.path.normpath(run_dir))
            axes[row][0].plot(steps, values, label=label)
            axes[row][1].plot(seconds, values, label=label)
        axes[row][0].set(xlabel="environment steps", ylabel=name)
        axes[row][1].set(xlabel="wall-clock seconds", ylabel=name)
        axes[row][0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
