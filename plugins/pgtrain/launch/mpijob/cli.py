"""``python -m pgtrain.launch.mpijob.cli render ...``: print the MPIJob a run would create, as YAML (no cluster needed).

    python -m pgtrain.launch.mpijob.cli render --world-size 8 --gpus-per-worker 4 --image IMAGE --run-id RUN
    python -m pgtrain.launch.mpijob.cli render --settings dags/pgtrain.yaml --world-size 8 --run-id RUN

``--settings`` takes the ``kubernetes:`` block of an author's settings file, as the train task does; a flag
given beside it wins.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pgtrain.config.settings import load_settings
from pgtrain.core.errors import ConfigError
from pgtrain.launch.mpijob.spec import build_mpijob, default, settings_from


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
    render.add_argument("--settings", metavar="FILE",
                        help="an author's settings file (dags/pgtrain.yaml): its kubernetes block")
    # Without --settings a flag's default is MPIJobSettings'; beside it, only the flags given go over the file's.
    def option(flag: str, setting: str, what: str = "", **kwargs: Any) -> None:
        render.add_argument(flag, dest=setting, help=f"{what}{' ' if what else ''}(default: {default(setting)})",
                            **kwargs)

    option("--gpus-per-worker", "gpus_per_worker", type=int)
    option("--image", "image")
    render.add_argument("--name", default="", help="MPIJob name (default: derived from the run id)")
    option("--namespace", "namespace")
    option("--secret", "database_secret", "the Secret holding the database URL")
    option("--secret-key", "database_secret_key")
    option("--worker-cpu", "worker_cpu")
    option("--worker-memory", "worker_memory")
    render.add_argument("--node-selector", action="append", metavar="KEY=VALUE")
    render.add_argument("--toleration", action="append", metavar="KEY[=VALUE][:EFFECT]")
    option("--active-deadline-seconds", "active_deadline_seconds", type=int)
    render.add_argument("--attempt", type=int, default=1,
                        help="the run's train attempt the trainer is told (pgtrain.runs.record.begin_attempt); a "
                             "trainer of an older attempt than the run's cannot write")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        kubernetes = dict(load_settings(args.settings).kubernetes) if args.settings else {}
        given = {key: getattr(args, key) for key in (
            "gpus_per_worker", "image", "namespace", "database_secret", "database_secret_key", "worker_cpu",
            "worker_memory", "active_deadline_seconds") if getattr(args, key) is not None}
        if args.node_selector:
            given["node_selector"] = _key_values(args.node_selector, "node-selector")
        if args.toleration:
            given["tolerations"] = [_toleration(t) for t in args.toleration]
        settings = settings_from({**kubernetes, **given}, run_id=args.run_id, world_size=args.world_size,
                                 name=args.name, attempt=args.attempt)
        sys.stdout.write(render_yaml(build_mpijob(settings)))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
