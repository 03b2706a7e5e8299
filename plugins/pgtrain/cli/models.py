"""pgtrain-models: list, show, promote, roll back and export model versions; show who holds which lock.

    pgtrain-models list [MODEL]                  versions (* marks the head)
    pgtrain-models show MODEL [VERSION]          metrics, run, time, tensors (default: the head)
    pgtrain-models promote MODEL VERSION         point the head at VERSION, under the model's lock
    pgtrain-models rollback MODEL [VERSION]      same; default: the newest version older than the head
    pgtrain-models export MODEL [VERSION] -o F   torch.save state dict (loads into the version's model)
    pgtrain-models predict --model M [--version N] --source T --key-column K [--feature-columns C ...] --into T
                           [--mode upsert|replace|append] [--skip-bad-rows] [--probabilities]
                                                 score a table's rows, write (key, prediction) into a table
    pgtrain-models gc MODEL --keep N [--force]   delete old versions (never the head; --force: also earlier heads)
    pgtrain-models history MODEL                 every move of the head
    pgtrain-models locks                         lock holders, tokens, leases

The database comes from $PGTRAIN_DATABASE_URL (e.g. postgresql://user@host:5432/dbname); there is no
command-line option for it, so that no password shows up in `ps` or in shell history. Give the
password in PGPASSWORD or ~/.pgpass, or inside $PGTRAIN_DATABASE_URL itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from pgtrain.config.metrics import CONFUSION_MATRIX, METRICS
from pgtrain.core.db import connect
from pgtrain.core.errors import PgtrainError
from pgtrain.data import encoding, level_storage
from pgtrain.data.source.resolve import CATEGORY
from pgtrain.store import catalog, model_store
from pgtrain.store.catalog import list_locks
from pgtrain.store.locks import describe_owner
from pgtrain.store.prediction_table import DEFAULT_MODE, MODES


def _when(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value else "-"


def _json_default(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=_json_default, sort_keys=True))


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else ("-" if value is None else str(value))


def cmd_list(conn, args) -> int:
    versions = catalog.list_versions(conn, args.model)
    if args.json:
        _print_json(versions)
        return 0
    if not versions:
        print(f"no versions{' of ' + args.model if args.model else ''} yet")
        return 0
    print(f"{'model':<20} {'version':>7}  {'val_acc':>7} {'val_loss':>8} {'token':>6}  {'created':<25} run")
    for v in versions:
        head = "*" if v["is_head"] else " "
        m = v["metrics"]
        print(f"{v['model_name']:<20} {head}{v['version']:>6}  {_fmt(m.get('val_accuracy')):>7} "
              f"{_fmt(m.get('val_loss')):>8} {v['fencing_token']:>6}  {_when(v['created_at']):<25} {v['run_id']}")
    return 0


def cmd_show(conn, args) -> int:
    info = model_store.get_version(conn, args.model, args.version)
    if args.json:
        _print_json(info)
        return 0
    print(f"model     {info['model_name']} version {info['version']}{'  (head)' if info['is_head'] else ''}")
    print(f"created   {_when(info['created_at'])} with fencing token {info['fencing_token']}")
    print(f"run       {info['run_id']} (dag {info['dag_id']}, dag run {info['dag_run_id']})")
    spec = info.get("spec") or {}
    if spec:
        print(f"model     {spec.get('model')} {json.dumps(spec.get('model_options') or {}, sort_keys=True)}: "
              f"{spec.get('input_dim')} -> {spec.get('output_dim')} ({spec.get('task')}), parent version "
              f"{_fmt(spec.get('parent_version'))}")
        print(f"data      {spec.get('source_table')} features {', '.join(spec.get('feature_columns') or [])} "
              f"target {spec.get('target_column')}")
        for column in encoding.columns_of(spec.get("encoding") or {}):
            if column.kind == CATEGORY:
                print(f"category  {column.name}: {level_storage.summary(column)}")
    else:
        print(f"shape     {info['input_dim']} -> {info['hidden_sizes']} -> {info['num_classes']}")
    metrics = dict(info["metrics"])
    matrix = metrics.pop(CONFUSION_MATRIX, None)
    print("metrics")
    for key, value in sorted(metrics.items()):
        label = f"  ({METRICS[key].label}, {METRICS[key].better})" if key in METRICS else ""
        print(f"  {key:<22} {_fmt(value)}{label}")
    if matrix:
        print("confusion matrix (rows: true class, columns: predicted class)")
        print(_matrix_text(matrix))
    print("tensors")
    for t in info["tensors"]:
        print(f"  {t['name']:<24} {t['dtype']:<8} {t['shape']}")
    return 0


def _matrix_text(matrix: dict[str, Any]) -> str:
    """The confusion matrix as aligned text, a row per true class (and one for classes the training rows lacked)."""
    rows = [[str(label), *map(str, counts)] for label, counts in zip(matrix["labels"], matrix["counts"], strict=True)]
    if any(matrix.get("unseen") or []):
        rows.append(["(not in training)", *map(str, matrix["unseen"])])
    table = [["true \\ predicted", *map(str, matrix["labels"])], *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join("  " + " ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                                       enumerate(zip(row, widths, strict=True))) for row in table)


def cmd_predict(conn, args) -> int:
    from pgtrain.store.inference import predict  # torch only for this command

    done = predict(conn, args.model, args.version, args.source, args.key_column, args.into,
                   feature_columns=args.feature_columns, batch_rows=args.batch_rows, skip_bad_rows=args.skip_bad_rows,
                   probabilities=args.probabilities, mode=args.mode)
    skipped = f" (skipped {done.skipped} bad rows)" if done.skipped else ""
    print(f"wrote {done.rows} predictions of {done.model_name} version {done.version} into {done.into}{skipped}; "
          f"mode {done.mode}")
    return 0


def cmd_gc(conn, args) -> int:
    deleted = model_store.collect_garbage(conn, args.model, args.keep, force=args.force,
                                          owner={"tool": "pgtrain-models", "action": "gc"},
                                          lock_timeout=args.lock_timeout)
    print(f"{args.model}: deleted versions {deleted}" if deleted else f"{args.model}: nothing to delete")
    return 0


def cmd_promote(conn, args) -> int:
    version = args.version
    if version is None:  # rollback without a version: the newest one older than the head
        head = model_store.head_version(conn, args.model)
        older = [v["version"] for v in catalog.list_versions(conn, args.model)
                 if head is not None and v["version"] < head]
        if not older:
            raise PgtrainError(f"model {args.model!r} has no version older than its head ({head}) to roll back to")
        version = older[-1]
    moved = model_store.promote(conn, args.model, version, owner={"tool": "pgtrain-models", "action": args.command},
                                lock_timeout=args.lock_timeout)
    print(f"{args.model}: head {moved.previous_version} -> {moved.version} (fencing token {moved.fencing_token})")
    return 0


def cmd_export(conn, args) -> int:
    version = model_store.export_state_dict(conn, args.model, args.version, args.output)
    print(f"wrote {args.output}: {args.model} version {version} (torch state dict; pgtrain.load_model rebuilds "
          "the module)")
    return 0


def cmd_history(conn, args) -> int:
    moves = catalog.head_history(conn, args.model)
    if args.json:
        _print_json(moves)
        return 0
    for m in moves:
        print(f"{_when(m['moved_at'])}  {m['action']:<8} {_fmt(m['previous_version']):>4} -> {m['version']:<4} "
              f"token {m['fencing_token']:<6} by {describe_owner(m['owner'])}")
    return 0


def cmd_locks(conn, args) -> int:
    locks = list_locks(conn)
    if args.json:
        _print_json(locks)
        return 0
    if not locks:
        print("no locks taken yet")
    for lock in locks:
        if lock["held"]:
            print(f"{lock['name']:<28} HELD  token {lock['token']:<6} by {describe_owner(lock['owner'])} since "
                  f"{_when(lock['acquired_at'])}, lease until {_when(lock['expires_at'])}")
        elif lock["owner"]:
            print(f"{lock['name']:<28} EXPIRED token {lock['token']:<6} (was {describe_owner(lock['owner'])}, "
                  f"lease ended {_when(lock['expires_at'])}); the next taker gets it")
        else:
            print(f"{lock['name']:<28} free  last token {lock['token']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgtrain-models", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list versions")
    p.add_argument("model", nargs="?")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", help="show one version (default: the head)")
    p.add_argument("model")
    p.add_argument("version", nargs="?", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_show)

    for name, required in (("promote", True), ("rollback", False)):
        p = sub.add_parser(name, help="point the head at a version, under the model's lock")
        p.add_argument("model")
        p.add_argument("version", type=int, nargs=None if required else "?")
        p.add_argument("--lock-timeout", type=float, default=60.0, help="seconds to wait for the lock")
        p.set_defaults(func=cmd_promote)

    p = sub.add_parser("export", help="save a version as a torch state dict")
    p.add_argument("model")
    p.add_argument("version", nargs="?", type=int)
    p.add_argument("-o", "--output", required=True, help="file to write (e.g. model.pt)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("predict", help="score a table with a version, write (key, prediction) into a table")
    p.add_argument("--model", required=True)
    p.add_argument("--version", default="head", help="a version number (default: the head)")
    p.add_argument("--source", required=True, help="table to score, schema-qualified and quoted as in SQL")
    p.add_argument("--key-column", required=True, help="unique key column, copied to the output")
    p.add_argument("--feature-columns", nargs="+", help="default: the columns the version was trained on")
    p.add_argument("--into", required=True, help="table to write; created when missing")
    p.add_argument("--mode", choices=MODES, default=DEFAULT_MODE,
                   help="upsert (default): insert or update each scored key's row, touch no other; replace: the "
                        "table's rows become this run's; append: add rows, refused when a key is there already. "
                        "Atomic: a failed run leaves the table as it was")
    p.add_argument("--batch-rows", type=int, default=10_000, help="rows read and scored at a time")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="score the other rows when some have a NULL key or NULL/non-finite features (default: refuse)")
    p.add_argument("--probabilities", action="store_true",
                   help="classification: also write each class's probability (double precision[], in class order; "
                        "the classes are recorded in the column's comment as JSON {\"classes\": [...]})")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("gc", help="delete old versions and their tensors")
    p.add_argument("model")
    p.add_argument("--keep", type=int, required=True, help="newest versions to keep (besides the head)")
    p.add_argument("--force", action="store_true", help="also delete versions that were the head before")
    p.add_argument("--lock-timeout", type=float, default=60.0, help="seconds to wait for the lock")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("history", help="every move of a model's head")
    p.add_argument("model")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("locks", help="who holds which lock")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_locks)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with connect(autocommit=True) as conn:  # $PGTRAIN_DATABASE_URL
            return args.func(conn, args)
    except PgtrainError as error:
        print(f"pgtrain-models: {error}", file=sys.stderr)
        return 1
    except psycopg.OperationalError as error:
        print(f"pgtrain-models: cannot use the training database: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
