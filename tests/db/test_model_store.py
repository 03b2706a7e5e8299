"""Versioned model store on a real PostgreSQL: commit rules, quality gate, concurrent commits, promote, export."""

from __future__ import annotations

import multiprocessing as mp
import re
import traceback

import numpy as np
import psycopg
import pytest

from pgtrain.config.params import TrainingConfig
from pgtrain.core.database_url import DATABASE_URL_ENV
from pgtrain.core.errors import CommitRejected, PgtrainError
from pgtrain.models.spec import ModelSpec
from pgtrain.runs.record import outcome, plan_run, record_epoch, set_model_layout
from pgtrain.runs.report import build_summary
from pgtrain.store.catalog import head_history, list_versions
from pgtrain.store.model_store import commit_run, export_state_dict, get_version, head_version, load_tensors, promote
from pgtrain.store.tensors import write_staged

SPEC = ModelSpec(input_dim=6, hidden_sizes=(5,), num_classes=3)
MODEL = "test-mlp"
OWNER = {"dag_id": "pgtrain_training", "run_id": "manual", "task_id": "commit_parameters"}


def parameters(fill: float, spec: ModelSpec = SPEC) -> dict[str, np.ndarray]:
    return {name: np.full(shape, fill, dtype=np.float32) for name, shape in spec.parameter_shapes().items()}


def prepare_run(url: str, dag_run_id: str, *, fill: float = 1.0, val_accuracy: float | None = 0.9,
                max_accuracy_drop: float | None = None, arrays: dict[str, np.ndarray] | None = None) -> str:
    """A trained run as the DAG leaves it before commit_parameters: sharded, staged parameters, metrics."""
    config = TrainingConfig(model_name=MODEL, hidden_sizes=SPEC.hidden_sizes, max_accuracy_drop=max_accuracy_drop)
    with psycopg.connect(url, autocommit=True) as conn:
        run = plan_run(conn, "pgtrain_training", dag_run_id, config)
        conn.execute("UPDATE pgtrain.training_runs SET input_dim = %s, num_classes = %s, output_dim = %s, "
                     "status = 'trained' WHERE run_id = %s",
                     (SPEC.input_dim, SPEC.num_classes, SPEC.num_classes, run.run_id))
        write_staged(conn, run.run_id, parameters(fill) if arrays is None else arrays)
        for epoch in (1, 2):
            record_epoch(conn, run.run_id, epoch, {"train_loss": 1.0 / epoch, "train_accuracy": 0.5 + epoch / 10,
                                                   "val_loss": 1.1 / epoch, "val_accuracy": val_accuracy,
                                                   "seconds": 0.25})
    return run.run_id


def run_status(url: str, run_id: str) -> tuple[str, str | None]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT status, status_reason FROM pgtrain.training_runs WHERE run_id = %s",
                            (run_id,)).fetchone()


def test_commit_creates_version_moves_head_and_is_idempotent(db_url, aconn):
    run_id = prepare_run(db_url, "r1", fill=0.5)

    first = commit_run(aconn, run_id, owner=OWNER, lock_timeout=5)
    again = commit_run(aconn, run_id, owner=OWNER, lock_timeout=5)

    assert (first.model_name, first.version, first.created) == (MODEL, 1, True)
    assert (again.version, again.created, again.fencing_token) == (1, False, first.fencing_token)
    assert first.metrics["val_accuracy"] == pytest.approx(0.9) and first.metrics["epochs"] == 2
    assert len(list_versions(aconn, MODEL)) == 1
    assert head_version(aconn, MODEL) == 1
    version, tensors = load_tensors(aconn, MODEL)
    assert version == 1 and set(tensors) == set(SPEC.parameter_shapes())
    assert all(np.array_equal(tensors[n], a) for n, a in parameters(0.5).items())
    assert run_status(db_url, run_id) == ("committed", None)
    lock = aconn.execute("SELECT owner FROM pgtrain.locks WHERE name = %s", (f"model:{MODEL}",)).fetchone()
    assert lock == (None,), "the model lock is released after the commit"


def _bad(kind: str) -> dict[str, np.ndarray]:
    arrays = parameters(1.0)
    if kind == "missing":
        del arrays["net.2.bias"]
    elif kind == "nan":
        arrays["net.0.weight"][1, 2] = np.nan
    elif kind == "inf":
        arrays["normalizer.std"][0] = np.inf
    elif kind == "shape":
        arrays["net.0.weight"] = np.ones((5, 7), dtype=np.float32)
    elif kind == "dtype":
        arrays["net.0.bias"] = np.ones(5, dtype=np.float64)
    return arrays


@pytest.mark.parametrize(("kind", "words"), [("missing", "missing tensor net.2.bias"),
                                             ("nan", "net.0.weight has 1 non-finite"),
                                             ("inf", "normalizer.std has 1 non-finite"),
                                             ("shape", "shape [5, 7], the model needs [5, 6]"),
                                             ("dtype", "dtype float64")])
def test_commit_rejects_incomplete_non_finite_or_misshaped_parameters(db_url, aconn, kind, words):
    good = commit_run(aconn, prepare_run(db_url, "good"), owner=OWNER)
    bad_run = prepare_run(db_url, f"bad-{kind}", arrays=_bad(kind))

    with pytest.raises(CommitRejected, match=re.escape(words)):
        commit_run(aconn, bad_run, owner=OWNER)

    status, reason = run_status(db_url, bad_run)
    assert status == "rejected" and words in reason
    assert head_version(aconn, MODEL) == good.version == 1
    assert [v["version"] for v in list_versions(aconn, MODEL)] == [1]


def test_quality_gate_rejects_with_reason_and_leaves_head_alone(db_url, aconn):
    commit_run(aconn, prepare_run(db_url, "base", val_accuracy=0.95), owner=OWNER)
    worse = prepare_run(db_url, "worse", val_accuracy=0.80, max_accuracy_drop=0.05)
    slightly_worse = prepare_run(db_url, "slightly", val_accuracy=0.92, max_accuracy_drop=0.05)

    with pytest.raises(CommitRejected, match=r"validation accuracy 0\.8000 is more than max_accuracy_drop=0\.05"):
        commit_run(aconn, worse, owner=OWNER)
    assert head_version(aconn, MODEL) == 1
    assert run_status(db_url, worse)[0] == "rejected"
    assert "below head version 1 (0.9500)" in run_status(db_url, worse)[1]

    assert commit_run(aconn, slightly_worse, owner=OWNER).version == 2
    assert head_version(aconn, MODEL) == 2


def test_commit_refuses_a_connection_inside_a_transaction(db_url, conn):
    run_id = prepare_run(db_url, "r1")
    conn.execute("SELECT 1")  # psycopg opened a transaction (no autocommit)
    with pytest.raises(PgtrainError, match="no transaction in progress"):
        commit_run(conn, run_id, owner=OWNER)
    conn.rollback()
    assert commit_run(conn, run_id, owner=OWNER).version == 1


# -- two DAG runs committing at the same moment --------------------------------------------------------
def _commit_worker(url: str, run_id: str, barrier, results) -> None:
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            barrier.wait(timeout=20)
            result = commit_run(conn, run_id, owner={"dag_id": "d", "run_id": run_id, "task_id": "commit"},
                                lock_timeout=20, ttl=2)
            results.put((run_id, "committed", result.version, result.fencing_token))
    except CommitRejected as rejected:
        results.put((run_id, "rejected", str(rejected), None))
    except Exception:  # reported to the parent
        results.put((run_id, "error", traceback.format_exc(), None))


def _head_reader(url: str, stop, results) -> None:
    """Read the head over and over while commits happen; report every torn or inconsistent view."""
    problems, reads = [], 0
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.is_set():
                try:
                    version, tensors = load_tensors(conn, MODEL)
                except PgtrainError:
                    continue  # no head yet
                reads += 1
                values = {float(np.unique(a)[0]) if np.unique(a).size == 1 else None for a in tensors.values()}
                if set(tensors) != set(SPEC.parameter_shapes()) or len(values) != 1 or None in values:
                    problems.append((version, sorted(tensors), values))
    finally:
        results.put(("reader", problems, reads, None))


def _commit_at_once(url: str, run_ids: list[str]) -> dict[str, tuple]:
    ctx = mp.get_context("fork")
    barrier, results, stop = ctx.Barrier(len(run_ids)), ctx.Queue(), ctx.Event()
    reader = ctx.Process(target=_head_reader, args=(url, stop, results))
    reader.start()
    workers = [ctx.Process(target=_commit_worker, args=(url, r, barrier, results)) for r in run_ids]
    for w in workers:
        w.start()
    out = {}
    for _ in workers:
        item = results.get(timeout=60)
        out[item[0]] = item[1:]
    stop.set()
    item = results.get(timeout=30)
    out[item[0]] = item[1:]
    for p in [*workers, reader]:
        p.join(timeout=30)
    errors = [v[1] for v in out.values() if v[0] == "error"]
    assert not errors, "\n".join(errors)
    return out


@pytest.mark.parametrize("round_", range(3))
def test_two_runs_committing_at_once_both_land_in_order_and_head_is_never_torn(db_url, aconn, round_):
    runs = {prepare_run(db_url, "a", fill=1.0): 1.0, prepare_run(db_url, "b", fill=2.0): 2.0}

    out = _commit_at_once(db_url, list(runs))

    problems, reads, _ = out.pop("reader")
    assert problems == [] and reads > 0
    assert sorted(v[0] for v in out.values()) == ["committed", "committed"]
    by_version = sorted((v[1], v[2], run_id) for run_id, v in out.items())
    assert [v for v, _, _ in by_version] == [1, 2]
    assert by_version[0][1] < by_version[1][1], "the later version carries the newer fencing token"
    rows = {v["version"]: v for v in list_versions(aconn, MODEL)}
    for version, token, run_id in by_version:
        assert rows[version]["run_id"] == run_id and rows[version]["fencing_token"] == token
        _, tensors = load_tensors(aconn, MODEL, version)
        assert all(np.all(a == runs[run_id]) for a in tensors.values())
    head = aconn.execute("SELECT version, fencing_token FROM pgtrain.model_heads WHERE model_name = %s",
                         (MODEL,)).fetchone()
    assert head == (2, by_version[1][1])
    assert [h["version"] for h in head_history(aconn, MODEL)] == [1, 2]


def test_two_runs_committing_at_once_under_a_gate_reject_the_worse_one_with_a_reason(db_url, aconn):
    commit_run(aconn, prepare_run(db_url, "base", val_accuracy=0.90), owner=OWNER)
    good = prepare_run(db_url, "good", fill=3.0, val_accuracy=0.91, max_accuracy_drop=0.05)
    bad = prepare_run(db_url, "bad", fill=4.0, val_accuracy=0.50, max_accuracy_drop=0.05)

    out = _commit_at_once(db_url, [good, bad])

    assert out.pop("reader")[0] == []
    assert out[good][:2] == ("committed", 2)
    assert out[bad][0] == "rejected" and "more than max_accuracy_drop=0.05 below head version" in out[bad][1]
    assert run_status(db_url, bad)[0] == "rejected"
    assert head_version(aconn, MODEL) == 2
    assert [v["version"] for v in list_versions(aconn, MODEL)] == [1, 2]


# -- operations ------------------------------------------------------------------------------------------
def test_promote_rolls_back_and_forward_under_the_lock(db_url, aconn):
    commit_run(aconn, prepare_run(db_url, "one", fill=1.0), owner=OWNER)
    second = commit_run(aconn, prepare_run(db_url, "two", fill=2.0), owner=OWNER)

    back = promote(aconn, MODEL, 1, owner={"user": "ops"})
    assert (back.version, back.previous_version) == (1, 2) and back.fencing_token > second.fencing_token
    assert head_version(aconn, MODEL) == 1 and load_tensors(aconn, MODEL)[1]["net.0.bias"][0] == 1.0
    with pytest.raises(PgtrainError, match=r"has no version 7; it has versions \[1, 2\]"):
        promote(aconn, MODEL, 7)
    assert head_version(aconn, MODEL) == 1

    third = commit_run(aconn, prepare_run(db_url, "three", fill=3.0), owner=OWNER)
    assert third.version == 3 and head_version(aconn, MODEL) == 3
    history = head_history(aconn, MODEL)
    assert [(h["action"], h["version"], h["previous_version"]) for h in history] == [
        ("commit", 1, None), ("commit", 2, 1), ("promote", 1, 2), ("commit", 3, 1)]
    assert history[2]["owner"]["user"] == "ops"


def test_export_loads_into_the_trainer_model(db_url, aconn, tmp_path):
    torch = pytest.importorskip("torch")
    from pgtrain.models.network import build_model

    rng = np.random.default_rng(0)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in SPEC.parameter_shapes().items()}
    arrays["normalizer.std"] = np.abs(arrays["normalizer.std"]) + 0.5
    commit_run(aconn, prepare_run(db_url, "one", arrays=arrays), owner=OWNER)

    version = export_state_dict(aconn, MODEL, None, tmp_path / "model.pt")
    model = build_model("mlp", SPEC.input_dim, SPEC.num_classes, {"hidden_sizes": list(SPEC.hidden_sizes)}, seed=0)
    model.load_state_dict(torch.load(tmp_path / "model.pt"), strict=True)

    assert version == 1
    for name, tensor in model.state_dict().items():
        assert np.array_equal(tensor.numpy(), arrays[name])
    info = get_version(aconn, MODEL, 1)
    assert (info["input_dim"], info["hidden_sizes"], info["num_classes"]) == (6, [5], 3)


# -- the command-line tool ---------------------------------------------------------------------------
def test_models_cli_reads_the_database_only_from_the_environment(monkeypatch, capsys):
    from pgtrain.cli.models import build_parser, main

    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    assert main(["list"]) == 1
    assert DATABASE_URL_ENV in capsys.readouterr().err
    # no option that would put a password on a command line (ps, shell history); the help says where it goes
    assert not any("database" in option for action in build_parser()._actions for option in action.option_strings)
    with pytest.raises(SystemExit):
        main(["list", "--database-url", "postgresql://db/x"])
    assert "unrecognized arguments: --database-url" in capsys.readouterr().err
    help_text = build_parser().format_help()
    assert DATABASE_URL_ENV in help_text and "PGPASSWORD" in help_text and ".pgpass" in help_text


def test_models_cli_lists_shows_promotes_rolls_back_and_exports(db_url, aconn, tmp_path, capsys, monkeypatch):
    from pgtrain.cli.models import main

    commit_run(aconn, prepare_run(db_url, "one", fill=1.0, val_accuracy=0.91), owner=OWNER)
    commit_run(aconn, prepare_run(db_url, "two", fill=2.0, val_accuracy=0.93), owner=OWNER)
    monkeypatch.setenv(DATABASE_URL_ENV, db_url)

    assert main(["list", MODEL]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert len(listing) == 3 and "*     2" in listing[2] and "0.9300" in listing[2]
    assert main(["show", MODEL, "1"]) == 0
    shown = capsys.readouterr().out
    assert "version 1" in shown and "pgtrain_training/one" in shown and "net.0.weight" in shown
    assert main(["rollback", MODEL]) == 0
    assert "head 2 -> 1" in capsys.readouterr().out and head_version(aconn, MODEL) == 1
    assert main(["promote", MODEL, "2"]) == 0 and head_version(aconn, MODEL) == 2
    assert main(["promote", MODEL, "9"]) == 1
    assert "has no version 9" in capsys.readouterr().err and head_version(aconn, MODEL) == 2
    assert main(["locks"]) == 0
    assert f"model:{MODEL}" in capsys.readouterr().out
    assert main(["history", MODEL]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4


def test_models_cli_runs_as_a_module_and_exports_a_loadable_state_dict(db_url, aconn, tmp_path):
    import os
    import subprocess
    import sys

    torch = pytest.importorskip("torch")
    commit_run(aconn, prepare_run(db_url, "one", fill=0.25), owner=OWNER)
    out = tmp_path / "v1.pt"

    proc = subprocess.run([sys.executable, "-m", "pgtrain.cli.models", "export", MODEL, "1", "-o", str(out)],
                          env={**os.environ, DATABASE_URL_ENV: db_url}, capture_output=True, text=True, timeout=120)

    assert proc.returncode == 0, proc.stderr
    state = torch.load(out)
    assert set(state) == set(SPEC.parameter_shapes()) and float(state["net.0.bias"][0]) == 0.25


# -- chunked versions, layouts, tasks, architectures (issue 9 / 10) ----------------------------------------
def prepare_any(url: str, dag_run_id: str, arrays: dict[str, np.ndarray], *, input_dim: int = 6,
                output_dim: int = 3, metrics: dict | None = None, layout: dict | None = None, **config) -> str:
    """A trained run of any model: its recorded model_layout (default: that of ``arrays``) and last metrics."""
    config = TrainingConfig(model_name=MODEL, **config)
    with psycopg.connect(url, autocommit=True) as conn:
        run = plan_run(conn, "pgtrain_training", dag_run_id, config)
        conn.execute("UPDATE pgtrain.training_runs SET input_dim = %s, output_dim = %s, num_classes = %s, "
                     "status = 'trained' WHERE run_id = %s",
                     (input_dim, output_dim, output_dim if config.task == "classification" else None, run.run_id))
        set_model_layout(conn, run.run_id, layout if layout is not None else
                         {n: {"shape": list(a.shape), "dtype": a.dtype.name} for n, a in arrays.items()})
        write_staged(conn, run.run_id, arrays)
        record_epoch(conn, run.run_id, 1, {"train_loss": 0.5, "val_loss": 0.5, "seconds": 0.1, **(metrics or {})})
    return run.run_id


def custom(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"normalizer.mean": np.zeros(6, np.float32), "normalizer.std": np.ones(6, np.float32),
            "net.encoder.weight": rng.standard_normal((4, 6)).astype(np.float32),
            "net.steps": np.array(7, dtype=np.int64), "net.mask": rng.random(4) > 0.5,
            "target.mean": np.zeros(3, np.float32), "target.std": np.ones(3, np.float32)}


def test_commit_hands_the_staged_blobs_to_the_version_without_copying_and_forgets_the_run_s(db_url, aconn,
                                                                                           monkeypatch):
    from pgtrain.store import tensors

    monkeypatch.setattr(tensors, "CHUNK_BYTES", 32)
    arrays = custom()
    run_id = prepare_any(db_url, "r1", arrays, metrics={"val_accuracy": 0.5})
    tensors.write_checkpoint(aconn, run_id, 1, {"w": np.ones(3, np.float32)}, {"epoch": 1})
    chunks = ("SELECT t.name, c.seq, md5(c.data), c.ctid::text FROM pgtrain.tensor_chunks c "
              "JOIN pgtrain.{} t USING (blob_id) ORDER BY 1, 2")
    staged_chunks = aconn.execute(chunks.format("staged_parameters")).fetchall()
    checkpoint_chunks = aconn.execute("SELECT count(*) FROM pgtrain.tensor_chunks").fetchone()[0] - len(staged_chunks)
    assert checkpoint_chunks > 0

    result = commit_run(aconn, run_id, owner=OWNER)

    version, loaded = load_tensors(aconn, MODEL)
    assert result.version == version == 1 and result.head_moved
    assert set(loaded) == set(arrays)
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype and loaded[name].tobytes() == array.tobytes(), name
    # the very same rows (same ctid: not rewritten), several per tensor
    assert aconn.execute(chunks.format("model_tensors")).fetchall() == staged_chunks
    assert len(staged_chunks) > len(arrays)
    for table in ("staged_parameters", "checkpoints"):
        assert aconn.execute(f"SELECT count(*) FROM pgtrain.{table}").fetchone() == (0,), table  # noqa: S608
    assert aconn.execute("SELECT count(*) FROM pgtrain.tensor_chunks").fetchone() == (len(staged_chunks),), \
        "the checkpoint's chunks are gone, the version's stay"
    assert result.metrics["parameter_count"] == sum(a.size for a in arrays.values())


def test_commit_checks_staged_tensors_against_the_recorded_model_layout(db_url, aconn):
    arrays = custom()
    layout = {n: {"shape": list(a.shape), "dtype": a.dtype.name} for n, a in arrays.items()}
    layout["net.encoder.weight"]["shape"] = [5, 6]
    layout["net.head.bias"] = {"shape": [3], "dtype": "float32"}
    layout["net.steps"]["dtype"] = "int32"
    run_id = prepare_any(db_url, "r1", arrays, layout=layout)

    with pytest.raises(CommitRejected) as rejected:
        commit_run(aconn, run_id, owner=OWNER)

    for words in ("missing tensor net.head.bias [3]", "net.encoder.weight has shape [4, 6], the model needs [5, 6]",
                  "net.steps has dtype int64, the model needs int32"):
        assert words in str(rejected.value)
    assert run_status(db_url, run_id)[0] == "rejected" and head_version(aconn, MODEL) is None
    assert aconn.execute("SELECT count(*) FROM pgtrain.tensor_chunks").fetchone() == (0,)
    with pytest.raises(CommitRejected, match="net.head.bias"):  # committing again repeats the verdict
        commit_run(aconn, run_id, owner=OWNER)


def test_non_finite_values_staged_before_they_were_counted_are_found_by_the_commit(db_url, aconn):
    arrays = custom()
    arrays["net.encoder.weight"][0, :2] = np.nan
    run_id = prepare_any(db_url, "r1", arrays)
    aconn.execute("UPDATE pgtrain.staged_parameters SET nonfinite = NULL")  # as migrated 001 rows are

    with pytest.raises(CommitRejected, match="net.encoder.weight has 2 non-finite values"):
        commit_run(aconn, run_id, owner=OWNER)


@pytest.mark.parametrize(("config", "metrics", "words"), [
    ({"max_rmse_rise": 0.1}, {"val_rmse": 1.25}, "validation RMSE 1.2500 is more than max_rmse_rise=0.1 above "
                                                 "head version 1 (1.0000)"),
    ({"max_rmse_rise": 0.3}, {"val_rmse": 1.25}, None),
    ({"max_val_rmse": 0.9}, {"val_rmse": 0.95}, "validation RMSE 0.9500 is above max_val_rmse=0.9"),
    ({"max_rmse_rise": 0.1}, {}, "the run has no validation RMSE to compare with head version 1"),
])
def test_regression_gate_compares_val_rmse_with_the_head_and_a_ceiling(db_url, aconn, config, metrics, words):
    regression = {"task": "regression", "model": "mlp", "hidden_sizes": (4,)}
    arrays = {n: np.full(s, 0.5, np.float32) for n, s in ModelSpec(6, (4,), 2).parameter_shapes().items()}
    commit_run(aconn, prepare_any(db_url, "base", arrays, output_dim=2, metrics={"val_rmse": 1.0}, **regression),
               owner=OWNER)
    run_id = prepare_any(db_url, "next", arrays, output_dim=2, metrics=metrics, **regression, **config)

    if words is None:
        assert commit_run(aconn, run_id, owner=OWNER).version == 2 and head_version(aconn, MODEL) == 2
    else:
        with pytest.raises(CommitRejected, match=re.escape(words)):
            commit_run(aconn, run_id, owner=OWNER)
        assert run_status(db_url, run_id)[0] == "rejected" and head_version(aconn, MODEL) == 1


@pytest.mark.parametrize(("gate", "metrics", "words"), [
    ({"max_drop": 0.01}, {"val_roc_auc": 0.895}, None),
    ({"max_drop": 0.01}, {"val_roc_auc": 0.85}, "validation ROC AUC 0.8500 is more than max_drop=0.01 below head "
                                                "version 1 (0.9000); the head stays at version 1"),
    ({"floor": 0.95}, {"val_roc_auc": 0.93}, "validation ROC AUC 0.9300 is below floor=0.95"),
    ({"max_drop": 0.01}, {"val_roc_auc": None}, "the run has no validation ROC AUC to compare with head version 1 "
                                                "(0.9000); train with validation_fraction > 0; it is undefined when "
                                                "a class the model knows has no validation rows"),
    ({"metric": "val_loss", "max_drop": 0.05}, {"val_loss": 0.54}, None),
    ({"metric": "val_loss", "max_drop": 0.05}, {"val_loss": 0.6}, "validation loss 0.6000 is more than max_drop=0.05 "
                                                                 "above head version 1 (0.5000)"),
    ({"metric": "val_loss", "floor": 0.4}, {"val_loss": 0.45}, "validation loss 0.4500 is above floor=0.4"),
])
def test_the_gate_judges_any_metric_in_its_direction(db_url, aconn, gate, metrics, words):
    commit_run(aconn, prepare_any(db_url, "base", custom(), metrics={"val_roc_auc": 0.9}), owner=OWNER)
    run_id = prepare_any(db_url, "next", custom(), metrics=metrics, **{"metric": "val_roc_auc", **gate})

    if words is None:
        assert commit_run(aconn, run_id, owner=OWNER).version == 2 and head_version(aconn, MODEL) == 2
        assert run_status(db_url, run_id) == ("committed", None)
    else:
        with pytest.raises(CommitRejected, match=re.escape(words)):
            commit_run(aconn, run_id, owner=OWNER)
        assert run_status(db_url, run_id)[0] == "rejected" and words in run_status(db_url, run_id)[1]
        assert head_version(aconn, MODEL) == 1


def test_a_head_without_the_gated_metric_is_not_compared_and_the_run_says_so(db_url, aconn):
    commit_run(aconn, prepare_any(db_url, "old", custom(), metrics={"val_accuracy": 0.9}), owner=OWNER)
    run_id = prepare_any(db_url, "new", custom(), metrics={"val_accuracy": 0.9, "val_roc_auc": 0.5},
                         metric="val_roc_auc", max_drop=0.0)

    assert commit_run(aconn, run_id, owner=OWNER).version == 2 and head_version(aconn, MODEL) == 2
    assert run_status(db_url, run_id) == ("committed", "quality gate: head version 1 recorded no validation ROC AUC: "
                                                       "max_drop was not applied")


def test_classification_floor_rejects_even_without_a_head(db_url, aconn):
    run_id = prepare_any(db_url, "r1", custom(), metrics={"val_accuracy": 0.6}, min_val_accuracy=0.7)
    with pytest.raises(CommitRejected, match=r"validation accuracy 0\.6000 is below min_val_accuracy=0\.7"):
        commit_run(aconn, run_id, owner=OWNER)
    assert list_versions(aconn, MODEL) == []


def test_a_new_architecture_is_committed_but_does_not_move_the_head(db_url, aconn):
    first = commit_run(aconn, prepare_any(db_url, "r1", custom(), metrics={"val_accuracy": 0.9}), owner=OWNER)
    wider = custom(1)
    wider["target.mean"], wider["target.std"] = np.zeros(4, np.float32), np.ones(4, np.float32)
    # a worse accuracy would fail the gate against the head, but a new architecture is not compared with it
    run_id = prepare_any(db_url, "r2", wider, output_dim=4, metrics={"val_accuracy": 0.5}, max_accuracy_drop=0.01)

    second = commit_run(aconn, run_id, owner=OWNER)

    assert (first.version, second.version, second.head_moved) == (1, 2, False)
    assert head_version(aconn, MODEL) == 1
    status, reason = run_status(db_url, run_id)
    assert status == "committed"
    assert "output_dim 3 -> 4" in reason and f"pgtrain-models promote {MODEL} 2" in reason
    again = commit_run(aconn, run_id, owner=OWNER)
    assert (again.created, again.head_moved) == (False, False)
    assert run_status(db_url, run_id) == (status, reason), "a repeated commit keeps the reason"
    promote(aconn, MODEL, 2)
    assert head_version(aconn, MODEL) == 2


def test_the_version_records_what_rebuilding_it_takes(db_url, aconn):
    run_id = prepare_any(db_url, "r1", custom(), feature_columns=("a", "b"), features_column=None,
                         label_column="y", task="classification", source_table='"Clinic"."Biopsies"')
    aconn.execute("UPDATE pgtrain.training_runs SET init_version = 7, backend = 'torch' WHERE run_id = %s",
                  (run_id,))
    commit_run(aconn, run_id, owner=OWNER)

    spec = get_version(aconn, MODEL)["spec"]
    options = {"hidden_sizes": list(TrainingConfig().hidden_sizes), "dropout": 0.0, "normalization": "none"}
    assert spec == {"model": "mlp", "model_options": options,
                    "input_dim": 6, "output_dim": 3,
                    "feature_columns": ["a", "b"], "target_column": "y", "task": "classification",
                    "standardize_target": True, "parent_version": 7, "encoding": None,
                    "source_table": '"Clinic"."Biopsies"',
                    "key_column": "id", "watermark": {"snapshot": None, "max_key": None}, "backend": "torch"}


def test_gc_keeps_the_newest_the_head_and_the_head_s_history_unless_forced(db_url, aconn, capsys, monkeypatch):
    from pgtrain.cli.models import main

    for i in range(1, 7):
        commit_run(aconn, prepare_run(db_url, f"r{i}", fill=float(i)), owner=OWNER)
    promote(aconn, MODEL, 2)  # head history: 1..6, then 2
    # as if 3 and 4 had never been heads (5 remains one: the head before 6)
    aconn.execute("DELETE FROM pgtrain.model_head_history WHERE version IN (3, 4) OR previous_version IN (3, 4)")
    monkeypatch.setenv(DATABASE_URL_ENV, db_url)

    assert main(["gc", MODEL, "--keep", "1"]) == 0
    assert "deleted versions [3, 4]" in capsys.readouterr().out
    assert [v["version"] for v in list_versions(aconn, MODEL)] == [1, 2, 5, 6]

    assert main(["gc", MODEL, "--keep", "1", "--force"]) == 0
    assert [v["version"] for v in list_versions(aconn, MODEL)] == [2, 6], "head 2 and newest 6 stay"
    assert aconn.execute("SELECT DISTINCT version FROM pgtrain.model_tensors ORDER BY 1").fetchall() == [(2,), (6,)]
    assert aconn.execute("SELECT DISTINCT t.version FROM pgtrain.tensor_chunks JOIN pgtrain.model_tensors t "
                         "USING (blob_id) ORDER BY 1").fetchall() == [(2,), (6,)]
    assert aconn.execute("SELECT count(*) FROM pgtrain.tensor_chunks WHERE blob_id NOT IN "
                         "(SELECT blob_id FROM pgtrain.model_tensors)").fetchone() == (0,), "no chunk left behind"
    assert load_tensors(aconn, MODEL)[1]["net.0.bias"][0] == 2.0

    assert main(["gc", MODEL, "--keep", "0", "--force"]) == 0
    assert [v["version"] for v in list_versions(aconn, MODEL)] == [2], "never the head"
    assert main(["gc", MODEL, "--keep", "-1"]) == 1


def test_a_commit_that_outlasts_its_lease_keeps_the_lock(db_url, aconn):
    """The commit's copy is held up (a table lock) for longer than the lease's ttl: nobody can take the
    model's lock meanwhile, and the commit lands."""
    import threading

    from pgtrain.core.errors import LockTimeout
    from pgtrain.store.locks import LockManager

    run_id = prepare_run(db_url, "slow")
    blocker = psycopg.connect(db_url)
    blocker.execute("LOCK TABLE pgtrain.model_tensors IN ACCESS EXCLUSIVE MODE")
    outcome: list = []
    committer = threading.Thread(target=lambda: outcome.append(
        commit_run(psycopg.connect(db_url, autocommit=True), run_id, owner=OWNER, ttl=0.6)))
    committer.start()
    try:
        waiting = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                   "AND query LIKE 'INSERT INTO pgtrain.model_tensors%'")
        while aconn.execute(waiting).fetchone()[0] == 0 and committer.is_alive():
            aconn.execute("SELECT pg_sleep(0.05)")
        # wait until the lease, renewed or not, would have ended without the commit holding the lock row
        aconn.execute("SELECT pg_sleep(1.5)")
        with LockManager(db_url) as other, pytest.raises(LockTimeout, match="HELD|held by"):
            other.acquire_lock(f"model:{MODEL}", timeout=0.5)
    finally:
        blocker.rollback()
        blocker.close()
        committer.join(timeout=60)
    assert outcome and outcome[0].created and outcome[0].version == 1
    assert head_version(aconn, MODEL) == 1


def test_a_commit_refuses_staged_tensors_rewritten_after_it_checked_them(db_url, aconn):
    """A later train attempt rewrites the staged tensors while the commit waits for their rows: the commit
    must not hand the version blobs it did not check (nor dangling ones); committing again takes the new ones."""
    import threading

    from pgtrain.store import tensors

    run_id = prepare_any(db_url, "r1", custom(0), metrics={"val_accuracy": 0.5})
    rewriter = psycopg.connect(db_url)
    rewriter.execute("SELECT 1")  # an open transaction: write_staged's becomes a savepoint in it
    tensors.write_staged(rewriter, run_id, custom(1))
    outcome: list = []

    def commit() -> None:
        try:
            outcome.append(commit_run(psycopg.connect(db_url, autocommit=True), run_id, owner=OWNER))
        except Exception as error:  # noqa: BLE001 - the assertion below says what was expected
            outcome.append(error)

    committer = threading.Thread(target=commit)
    committer.start()
    try:
        waiting = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                   "AND query LIKE 'SELECT name, blob_id FROM pgtrain.staged_parameters%'")
        while aconn.execute(waiting).fetchone()[0] == 0 and committer.is_alive():
            aconn.execute("SELECT pg_sleep(0.05)")
        rewriter.commit()
    finally:
        rewriter.close()
        committer.join(timeout=60)
    assert len(outcome) == 1 and isinstance(outcome[0], PgtrainError), outcome
    assert "were written again while it was being committed" in str(outcome[0])
    assert list_versions(aconn, MODEL) == [] and run_status(db_url, run_id)[0] == "trained"

    assert commit_run(aconn, run_id, owner=OWNER).version == 1
    loaded = load_tensors(aconn, MODEL)[1]
    assert all(loaded[n].tobytes() == a.tobytes() for n, a in custom(1).items())
    assert aconn.execute("SELECT count(*) FROM pgtrain.tensor_chunks WHERE blob_id NOT IN "
                         "(SELECT blob_id FROM pgtrain.model_tensors)").fetchone() == (0,), "no chunk left behind"


def test_a_version_recorded_by_an_earlier_pgtrain_is_read_in_the_current_shape(conn):
    """Every read of a version's spec goes through the one converter (pgtrain.data.upgrade), not a branch."""
    from psycopg.types.json import Jsonb

    from pgtrain.store.model_store import version_layout
    from tests.unit.test_version_upgrade import FROM_MIGRATION_004

    with conn.transaction():
        conn.execute("INSERT INTO pgtrain.model_versions (model_name, version, fencing_token, spec) "
                     "VALUES ('old', 1, 1, %s)", (Jsonb(FROM_MIGRATION_004),))
    _, spec, _ = version_layout(conn, "old", 1)
    assert spec["backend"] == "horovod" and spec["encoding"] is None
    assert spec["model_options"] == {"hidden_sizes": [32, 16], "dropout": 0.0, "normalization": "none"}
    assert get_version(conn, "old", 1)["spec"] == spec


def test_a_runs_summary_and_note_read_its_version_and_the_head_through_the_store_s_owner(db_url, aconn):
    first, second = prepare_run(db_url, "s1"), prepare_run(db_url, "s2")
    commit_run(aconn, first, owner=OWNER, lock_timeout=5)
    commit_run(aconn, second, owner=OWNER, lock_timeout=5)
    promote(aconn, MODEL, 1, owner=OWNER, lock_timeout=5)
    unplanned = prepare_run(db_url, "s3")

    summaries = {run_id: build_summary(aconn, run_id) for run_id in (first, second, unplanned)}

    assert [(s["version"], s["is_head"]) for s in summaries.values()] == [(1, True), (2, False), (None, False)]
    assert outcome(aconn, second) == (f"{MODEL} v2 committed: val_accuracy 0.9000, val_loss 0.5500; "
                                      "head v1 -> v2 (since moved to v1)")
    assert outcome(aconn, unplanned) == f"{MODEL}: trained; head stays v1"
