"""Where a rank's weights start: a checkpoint of this run (its optimizer state, best epoch's parameters and metrics
too), a committed version
(``init_from``: warm start), or scratch. Rank 0 decides and every rank learns the outcome; rank 0 writes the
checkpoints a retried train task resumes from.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
import torch

from pgtrain.core.errors import ConfigError, PgtrainError
from pgtrain.models.network import PgtrainModel, layout_problems, writable_tensor
from pgtrain.runs import record
from pgtrain.store import model_store, tensors
from trainer import collectives
from trainer.optim import OPTIMIZER_PREFIX, optimizer_arrays

# Checkpoint tensor names: the model's state dict, the optimizer's state (trainer.optim.OPTIMIZER_PREFIX) and the
# best epoch's state dict (early stopping), one array each.
MODEL_PREFIX = "model."
BEST_PREFIX = "best."
# 2: optimizer state of any optimizer and the best epoch's parameters (1 held SGD's momentum only).
CHECKPOINT_FORMAT = 2
# The regression clamp's bounds (models.network.ClampedUnstandardize). A version or checkpoint from before the clamp
# has none: the run fills them from its own training rows, as a run from scratch does, instead of refusing the state.
CLAMP_BOUNDS = ("target.low", "target.high")


@dataclass
class Start:
    epoch: int = 0  # the last epoch already trained (from a checkpoint)
    init_version: int | None = None
    from_state: bool = False  # the model's buffers come from a checkpoint or version: no new statistics
    optimizer: dict[str, np.ndarray] = field(default_factory=dict)  # rank 0 only
    best: dict[str, np.ndarray] = field(default_factory=dict)  # rank 0 only: the best epoch's state dict
    history: list[dict[str, Any]] = field(default_factory=list)  # metrics of the epochs already trained
    note: str | None = None
    error: str | None = None
    fill_bounds: bool = False  # the state had no clamp bounds: the trainer computes them from the training rows


def plan_fingerprint(shards: list[record.Shard]) -> str:
    """Identifies the manifest a checkpoint was trained on: a re-planned run must not resume from it."""
    text = "|".join(f"{s.rank}:{s.key_lo}:{s.key_hi}:{s.row_count}:{s.train_count}" for s in shards)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def resolve_start(conn: psycopg.Connection, run: record.Run, model: PgtrainModel, fingerprint: str) -> Start:
    """Rank 0: load the weights the run starts from into ``model``; PgtrainError when they do not fit."""
    found = tensors.read_checkpoint(conn, run.run_id)
    if found is not None:
        epoch, arrays, meta = found
        state = {k.removeprefix(MODEL_PREFIX): v for k, v in arrays.items() if k.startswith(MODEL_PREFIX)}
        # A checkpoint from before the clamp (no bounds) is older than its format says: the run starts over.
        older = meta.get("format") != CHECKPOINT_FORMAT or with_bounds(model, state)[1]
        if meta.get("plan") == fingerprint and not older:
            problems = layout_problems(model, state)
            if problems:
                raise PgtrainError(f"the checkpoint of run {run.run_id} at epoch {epoch} does not fit the run's "
                                   f"model: {'; '.join(problems)}; delete it (tensors.delete_checkpoints) to "
                                   "train from scratch")
            load_arrays(model, state)
            return Start(epoch, meta.get("init_version"), True,
                         {k: v for k, v in arrays.items() if k.startswith(OPTIMIZER_PREFIX)},
                         {k.removeprefix(BEST_PREFIX): v for k, v in arrays.items() if k.startswith(BEST_PREFIX)},
                         list(meta.get("metrics", [])), f"resuming from the checkpoint of epoch {epoch}")
        note = (f"ignoring the checkpoint of epoch {epoch}: "
                + ("it was trained on another shard plan" if meta.get("plan") != fingerprint else
                   "it was written by an older pgtrain"))
    else:
        note = None
    version = init_version(conn, run)
    if version is None:
        return Start(note=note)
    try:
        _, arrays = model_store.load_tensors(conn, run.model_name, version)
    except PgtrainError as error:
        raise ConfigError(f"init_from={run.config.init_from!r}: {error}") from error
    arrays, fill_bounds = with_bounds(model, arrays)
    problems = layout_problems(model, arrays)
    if problems:
        raise ConfigError(
            f"init_from={run.config.init_from!r}: version {version} of model {run.model_name!r} does not fit this "
            f"run's model {run.config.model!r} (input_dim {run.input_dim}, output_dim {model.output_dim}): "
            f"{'; '.join(problems)}; use the same model and options as that version, or init_from=scratch")
    # The warm model keeps its parent's normalizer and target scale (no new statistics): it starts out
    # computing exactly the parent's function, and fine-tuning moves it from there. Statistics of the new
    # rows would silently change what every parent weight means.
    load_arrays(model, arrays)
    return Start(init_version=version, from_state=True, fill_bounds=fill_bounds,
                 note=f"warm start from version {version} of model {run.model_name!r} (init_from="
                      f"{run.config.init_from!r})")


def with_bounds(model: torch.nn.Module, arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], bool]:
    """``arrays`` with the model's clamp bounds added where they lack them (the model's unfilled defaults), and
    whether they did."""
    state = model.state_dict()
    missing = {name: state[name].detach().cpu().numpy()
               for name in CLAMP_BOUNDS if name in state and name not in arrays}
    return {**arrays, **missing}, bool(missing)


def init_version(conn: psycopg.Connection, run: record.Run) -> int | None:
    """The committed version ``init_from`` names now ("head" with no head yet: None, i.e. scratch)."""
    init_from = run.config.init_from
    if init_from == "scratch":
        return None
    if init_from == "head":
        head = model_store.head_version(conn, run.model_name)
        if head is None:
            print(f"init_from=head: model {run.model_name!r} has no head yet; training from scratch", flush=True)
        return head
    return int(init_from)


def load_arrays(model: torch.nn.Module, arrays: dict[str, np.ndarray]) -> None:
    # Stored arrays are read-only little-endian views; torch wants writable native-order memory.
    model.load_state_dict({name: writable_tensor(a)
                           for name, a in arrays.items()}, strict=True)


def agree_on_start(conn: psycopg.Connection, run: record.Run, model: PgtrainModel, rank: int,
                   fingerprint: str) -> Start:
    """Rank 0 decides; every rank learns the outcome, so a refusal stops all ranks with the same line."""
    start = Start()
    if rank == 0:
        try:
            start = resolve_start(conn, run, model, fingerprint)
        except PgtrainError as error:
            start = Start(error=str(error))
    shared = collectives.broadcast_object({"epoch": start.epoch, "init_version": start.init_version,
                                           "from_state": start.from_state, "error": start.error,
                                           "fill_bounds": start.fill_bounds}, "start")
    if shared["error"] is not None:
        raise ConfigError(shared["error"])
    if rank != 0:
        start = Start(shared["epoch"], shared["init_version"], shared["from_state"],
                      fill_bounds=shared["fill_bounds"])
    elif start.note:
        print(start.note, flush=True)
    return start


def write_checkpoint(conn: psycopg.Connection, run: record.Run, epoch: int, model: PgtrainModel,
                     optimizer: torch.optim.Optimizer, start: Start, history: list[dict[str, Any]],
                     fingerprint: str, best: dict[str, torch.Tensor] | None) -> None:
    """Rank 0: everything a retried task needs to go on exactly as if it had not stopped (the schedule's position
    is the epoch; early stopping's state is in the metrics)."""
    arrays = {MODEL_PREFIX + name: t.detach().cpu().numpy() for name, t in model.state_dict().items()}
    arrays.update(optimizer_arrays(optimizer, model))
    arrays.update({BEST_PREFIX + name: t.detach().cpu().numpy() for name, t in (best or {}).items()})
    meta = {"format": CHECKPOINT_FORMAT, "epoch": epoch, "init_version": start.init_version, "plan": fingerprint,
            "metrics": [record.json_safe(m) for m in history]}
    tensors.write_checkpoint(conn, run.run_id, epoch, arrays, meta)


def check_encoding_parent(run: record.Run, init_version: int | None) -> None:
    """A warm start loads weights made for its version's encoding: the one compute_shards planned with."""
    if not run.encoding or init_version is None:
        return
    planned = run.encoding.get("parent_version")
    if planned != init_version:
        raise PgtrainError(
            f"run {run.run_id} was planned with the input encoding of "
            f"{'version ' + str(planned) if planned else 'its own rows'} but warm-starts from version {init_version} "
            f"(init_from={run.config.init_from!r}: "
            f"{'the head moved' if run.config.init_from == 'head' else 'that version was committed'} since planning); "
            "re-run the DAG run from compute_shards")
