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

from pgtrain.config.kubernetes import SETTINGS, Flag, default
from pgtrain.config.settings import load_settings
from pgtrain.core.errors import ConfigError
from pgtrain.launch.mpijob.spec import author_problems, build_mpijob, settings_from


def render_yaml(manifest: Mapping[str, Any]) -> str:
    import yaml  # only the CLI needs it

    return yaml.safe_dump(dict(manifest), sort_keys=False, default_flow_style=False)


_SCALARS = {"string": str, "integer": int, "number": float}


def _flags() -> dict[str, tuple[str, dict[str, Any]]]:
    """setting -> (its flag, argparse's arguments): every scalar author setting has one (--name-with-dashes unless
    it declares another), a mapping or sequence setting one where it declares how an item is written."""
    flags = {}
    for name, declared in SETTINGS.items():
        if not declared.author or declared.role == "operator":
            continue
        kinds = declared.schema.get("type")
        kind = next((k for k in ([kinds] if isinstance(kinds, str) else kinds or []) if k != "null"), None)
        flag = declared.flag or Flag("--" + name.replace("_", "-"))
        if declared.flag is not None and declared.flag.item is not None:
            arguments: dict[str, Any] = {"action": "append", "type": declared.flag.item, "metavar": flag.metavar}
        elif kind == "boolean":
            arguments = {"action": argparse.BooleanOptionalAction}
        elif kind in _SCALARS:
            arguments = {"type": _SCALARS[kind], "metavar": flag.metavar}
        else:
            continue
        flags[name] = (flag.name, arguments)
    return flags


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pgtrain.launch.mpijob.cli", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    render = sub.add_parser("render", help="print the MPIJob as YAML (no cluster needed)")
    render.add_argument("--run-id", required=True, help="training run id (plan_run creates it)")
    render.add_argument("--world-size", type=int, required=True, help="Horovod ranks = GPUs")
    render.add_argument("--settings", metavar="FILE",
                        help="an author's settings file (dags/pgtrain.yaml): its kubernetes block")
    render.add_argument("--name", default="", help="MPIJob name (default: derived from the run id)")
    # Without --settings a flag's default is the setting's; beside it, only the flags given go over the file's.
    for name, (flag, arguments) in _flags().items():
        render.add_argument(flag, dest=name, help=f"{SETTINGS[name].help} (default: {default(name)})", **arguments)
    render.add_argument("--attempt", type=int, default=1,
                        help="the run's train attempt the trainer is told (pgtrain.runs.record.begin_attempt); a "
                             "trainer of an older attempt than the run's cannot write")
    return parser


def _value(name: str, given: Any) -> Any:
    """A flag's value as the setting's: a mapping setting's (key, value) pairs as one mapping."""
    return dict(given) if isinstance(default(name), Mapping) else given


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        kubernetes = dict(load_settings(args.settings).kubernetes) if args.settings else {}
        given = {name: _value(name, getattr(args, name)) for name in _flags() if getattr(args, name) is not None}
        problems = author_problems(given)
        if problems:
            raise ConfigError("; ".join(problems))
        settings = settings_from({**kubernetes, **given}, run_id=args.run_id, world_size=args.world_size,
                                 name=args.name, attempt=args.attempt)
        sys.stdout.write(render_yaml(build_mpijob(settings)))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
