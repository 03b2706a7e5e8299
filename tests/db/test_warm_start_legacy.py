"""Warm start from a version the previous release committed: its spec has no encoding (sql/010_encodings.sql came
after it), its input was its scalar columns as numbers. Such a version warm-starts a run of numeric columns, or the
run is refused with the true reason, when it is planned."""

from __future__ import annotations

import psycopg
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("horovod.torch")

from pgtrain.core.errors import SourceError  # noqa: E402
from pgtrain.models.network import build_model, layout_problems, state_layout  # noqa: E402
from pgtrain.runs import record  # noqa: E402
from pgtrain.store import model_store  # noqa: E402
from pgtrain.store.tensors import write_staged  # noqa: E402
from tests.support import planned_run  # noqa: E402
from trainer.start import check_encoding_parent  # noqa: E402

PARAMS = {"source_table": "public.t", "key_column": "id", "feature_columns": ["a", "b"], "label_column": "label",
          "model_name": "legacy"}


def legacy_version(conn: psycopg.Connection) -> None:
    """Version 1 of 'legacy' as the previous release stored it: its run and its spec without an encoding (that
    release's version_spec wrote model, widths, feature_columns, target, task, source, key and watermark only)."""
    conn.execute("CREATE TABLE public.t (id integer PRIMARY KEY, a double precision, b real NOT NULL, "
                 "label integer NOT NULL)")
    conn.execute("INSERT INTO public.t SELECT i, i * 0.5, i % 7, i % 3 FROM generate_series(1, 200) i")
    run = planned_run(conn, "v1", **PARAMS)
    config = run.config
    model = build_model(config.model, run.input_dim, run.output_dim, config.model_options_for_build, config.seed)
    record.set_model_layout(conn, run.run_id, state_layout(model))
    write_staged(conn, run.run_id, {n: t.numpy() for n, t in model.state_dict().items()})
    record.record_epoch(conn, run.run_id, 1, {"train_loss": 0.1, "val_loss": 0.1, "val_accuracy": 0.5, "seconds": 0.1})
    record.set_status(conn, run.run_id, "trained")
    assert model_store.commit_run(conn, run.run_id, owner={"task_id": "test"}).version == 1
    conn.execute("UPDATE pgtrain.training_runs SET encoding = NULL WHERE run_id = %s", (run.run_id,))
    conn.execute("UPDATE pgtrain.model_versions SET spec = spec - 'encoding' WHERE model_name = 'legacy'")
    spec = conn.execute("SELECT spec FROM pgtrain.model_versions WHERE model_name = 'legacy'").fetchone()[0]
    assert "encoding" not in spec and spec["feature_columns"] == ["a", "b"] and spec["input_dim"] == 2


@pytest.mark.parametrize("init_from", ["head", 1])
def test_a_version_without_an_encoding_warm_starts_a_run_of_numeric_columns(ac, init_from):
    legacy_version(ac)
    ac.execute("INSERT INTO public.t SELECT i, i * 0.5, i % 7, i % 3 FROM generate_series(201, 260) i")

    run = planned_run(ac, f"warm-{init_from}", init_from=init_from, **PARAMS)

    assert run.encoding["parent_version"] == 1
    assert [(c["name"], c["kind"], c["mean"], c["missing"]) for c in run.encoding["columns"]] == [
        ("a", "number", None, False), ("b", "number", None, False)]
    check_encoding_parent(run, 1)  # the trainer's check: planned with version 1's encoding, as it warm-starts
    model = build_model(run.config.model, run.input_dim, run.output_dim, run.config.model_options_for_build,
                        run.config.seed, run.encoding)
    _, arrays = model_store.load_tensors(ac, "legacy", 1)
    assert layout_problems(model, arrays) == []


def test_a_version_without_an_encoding_refuses_what_it_cannot_encode_with_the_true_reason(ac):
    legacy_version(ac)
    ac.execute("UPDATE public.t SET a = NULL WHERE id % 10 = 0")
    with pytest.raises(SourceError, match=r"no value to impute a NULL with in 'a' \(a NULL was a bad row"):
        planned_run(ac, "nulls", init_from="head", **PARAMS)

    ac.execute("UPDATE public.t SET a = id * 0.5")
    ac.execute("ALTER TABLE public.t ALTER COLUMN b TYPE text")
    with pytest.raises(SourceError, match=r"trained on the feature columns a \(number\), b \(number\); this run has "
                                          r"a \(number\), b \(category\)"):
        planned_run(ac, "text", init_from="head", min_category_count=1, **PARAMS)
