"""``python -m pgtrain.launch.mpijob.cli render ...``: print the MPIJob a run would create, as YAML (no cluster needed).

    python -m pgtrain.launch.mpijob.cli render --world-size 8 --gpus-per-worker 4 --image IMAGE --run-id RUN
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pgtrain.core.errors import ConfigError
from pgtrain.launch.mpijob.spec import MPIJobSettings, build_mpijob, default


def render_yaml(manifest: Mapping[str, Any]) -> str:
    import yaml  # only the CLI needs it

    return yaml.safe_dump(dict(manifest), sort_keys=False, default_flow_style=False)


def _key_values(items: Sequence[str], what: str) -> dict[str, str]:
    result = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--{what} expects KEY=VALUE, got {item!r}")
        result[key] = value
    return result


def _toleration(text: str) -> dict[str, str]:
    """KEY[=VALUE][:EFFECT], as kubectl taint writes taints."""
    spec, _, effect = text.partition(":")
    key, sep, value = spec.partition("=")
    toleration = {"key": key, "operator": "Equal" if sep else "Exists"}
    if sep:
        toleration["value"] = value
    if effect:
        toleration["effect"] = effect
    return toleration


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pgtrain.launch.mpijob.cli", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    render = sub.add_parser("render", help="print the MPIJob as YAML (no cluster needed)")
    render.add_argument("--run-id", required=True, help="training run id (plan_run creates it)")
    render.add_argument("--world-size", type=int, required=True, help="Horovod ranks = GPUs")
    render.add_argument("--gpus-per-worker", type=int, default=default("gpus_per_worker"))
    render.add_argument("--image", default=default("image"))
    render.add_argument("--name", default="", help="MPIJob name (default: derived from the run id)")
    render.add_argument("--namespace", default=default("namespace"))
    render.add_argument("--secret", default=default("database_secret"), help="Secret holding the database URL")
    render.add_argument("--secret-key", default=default("database_secret_key"))
    render.add_argument("--worker-cpu", default=default("worker_cpu"))
    render.add_argument("--worker-memory", default=default("worker_memory"))
    render.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE")
    render.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]")
    render.add_argument("--active-deadline-seconds", type=int, default=default("active_deadline_seconds"))
    render.add_argument("--attempt", type=int, default=1,
                        help="the run's train attempt the trainer is told (pgtrain.runs.record.begin_attempt); a "
                             "trainer of an older attempt than the run's cannot write")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = MPIJobSettings(
            run_id=args.run_id, world_size=args.world_size, gpus_per_worker=args.gpus_per_worker,
            image=args.image, name=args.name, namespace=args.namespace, database_secret=args.secret,
            database_secret_key=args.secret_key, worker_cpu=args.worker_cpu, worker_memory=args.worker_memory,
            node_selector=_key_values(args.node_selector, "node-selector"),
            tolerations=[_toleration(t) for t in args.toleration],
            active_deadline_seconds=args.active_deadline_seconds, attempt=args.attempt,
        )
        sys.stdout.write(render_yaml(build_mpijob(settings)))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
