"""What is sized by the number of environments must hold every env runner's env ids.

Env runner replica ``r`` steps env ids ``r * num_envs .. (r + 1) * num_envs - 1``, and a replay
store keeps one ring per env id (``num_environments``). A graph whose runners would step more
envs than a replay store holds is refused at load, and -- because ``run.py scale`` checks the
graph as it would be after the scale with every graph check (``Supervisor.cmd_scale``) -- a
scale of runners beyond it is refused with one line before anything changes (issue 11: the
replay store crash-looped on ``env id 7`` and took the run down).
"""

from __future__ import annotations

from pipeline.config import ConfigError
from pipeline.kinds import register_graph_check


@register_graph_check
def environment_ids_fit(graph) -> None:
    runners = [(name, spec.replicas * graph.configs[name].num_envs)
               for name, spec in graph.nodes.items() if spec.kind == "env_runner"]
    # Every runner node numbers its env ids from 0 by replica, so the largest one decides.
    needed = max((n for _, n in runners), default=0)
    for name, spec in graph.nodes.items():
        if spec.kind != "replay_store":
            continue
        held = graph.configs[name].num_environments
        if held < needed:
            runner, _ = max(runners, key=lambda r: r[1])
            replicas = graph.nodes[runner].replicas
            raise ConfigError(
                f"nodes.{name}.config.num_environments",
                f"{held} env ids, but {runner} steps {needed} ({replicas} replicas x "
                f"{graph.configs[runner].num_envs} envs); make num_environments >= {needed}")
