"""The input record on a real PostgreSQL: planning resolves it once and stores it with the run, for array features
as for scalar columns; the commit copies it verbatim into the version, whose identity is the record's; a version
from before input records is read through the one converter."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import psycopg
import pytest

from pgtrain.config.params import TrainingConfig
from pgtrain.core.errors import PgtrainError
from pgtrain.data import input_record, loader, manifest
from pgtrain.data.input_record import InputRecord, Split
from pgtrain.data.source import resolve
from pgtrain.data.source.resolve import COLUMNS, NUMBER, Column
from pgtrain.models.spec import ModelSpec
from pgtrain.planning.plan import author_admitting
from pgtrain.runs import record
from pgtrain.store import identity, model_store
from pgtrain.store.inference import load_predictor
from pgtrain.store.tensors import write_staged
from tests.support import make_mixed_table, mixed_params, planned_run, seed_samples


def commit(conn: psycopg.Connection, run: record.Run) -> dict:
    """Stage zeros of the run's MLP and commit them; returns the version's spec."""
    shapes = ModelSpec(run.input_dim, run.config.hidden_sizes, run.output_dim).parameter_shapes()
    write_staged(conn, run.run_id, {n: np.zeros(s, np.float32) for n, s in shapes.items()})
    record.record_epoch(conn, run.run_id, 1, {"train_loss": 1.0, "val_loss": 1.0, "val_accuracy": 0.5,
                                              "seconds": 0.1})
    version = model_store.commit_run(conn, run.run_id, owner={"task_id": "test"}).version
    return model_store.get_version(conn, run.config.model_name, version)["spec"]


def test_an_array_feature_run_records_its_input_with_the_run(ac):
    seed_samples(ac, 120, dim=6, classes=3)
    run = planned_run(ac, world_size=2, validation_fraction=0.25, test_fraction=0.1, seed=7)

    planned = input_record.of_run(run)

    assert planned.is_array_input and planned.feature_columns == ("features",) and planned.columns == ()
    assert (planned.schema, planned.table, planned.key_column, planned.key_type) == ("public", "samples", "id",
                                                                                   "bigint")
    assert (planned.input_dim, planned.output_dim, planned.num_classes) == (6, 3, 3) == (
        run.input_dim, run.output_dim, run.num_classes)
    assert planned.split == Split(0.25, 0.1, 7) and planned.target_column == "label"


def test_a_record_reads_back_as_it_was_written(ac):
    make_mixed_table(ac, 200)
    run = planned_run(ac, exclude_columns=["seen"], **mixed_params())

    planned = InputRecord.from_json(run.encoding)

    assert planned.to_json() == run.encoding
    assert not planned.is_array_input and planned.feature_format == COLUMNS
    assert planned.feature_columns == ("island", "sex", "colour", "cut", "flagged", "body_mass", "bill")
    assert planned.source(None).column_names == planned.feature_columns


def test_a_commit_copies_the_runs_record_verbatim_into_the_version(ac):
    seed_samples(ac, 120, dim=6, classes=3)
    run = planned_run(ac, model_name="arrays")

    spec = commit(ac, run)

    assert spec["encoding"] == run.encoding  # array features included
    assert input_record.of_version(spec) == input_record.of_run(run)
    assert (spec["input_dim"], spec["output_dim"], spec["feature_columns"]) == (6, 3, ["features"])


def test_an_array_version_is_bound_to_its_features_column(ac):
    seed_samples(ac, 120, dim=6, classes=3)
    ac.execute("ALTER TABLE public.samples ADD COLUMN other real[]")
    ac.execute("UPDATE public.samples SET other = features")
    head = commit(ac, planned_run(ac, "one", model_name="arrays"))
    # Planning refuses a run of other data under the same name unless the author allows re-targeting (issue 30).
    params = {"model_name": "arrays", "features_column": "other"}
    admitting = author_admitting(ac, TrainingConfig.from_mapping(params))
    retarget = replace(admitting, quality_gate={**admitting.quality_gate, "allow_retarget": True})
    other = commit(ac, planned_run(ac, "two", author=retarget, **params))

    assert identity.differences(ac, identity.of_version(head), identity.of_version(other)) == [
        "input columns 'other' that the head's lacks, without the head's 'features'"]
    assert model_store.head_version(ac, "arrays") == 2  # re-targeting allowed: the head moved to the other data


def test_a_version_from_before_input_records_is_read_through_from_version():
    # As the previous release wrote them: an array version had no encoding, a column version one of format 1.
    array = {"input_dim": 8, "output_dim": 4, "feature_columns": ["features"], "target_column": "label",
             "task": "classification", "source_table": "public.samples", "key_column": "id", "encoding": None}
    columns = {"input_dim": 2, "output_dim": 1, "feature_columns": ["a", "b"], "target_column": "y",
               "task": "regression", "source_table": "public.t", "key_column": "id",
               "encoding": {"format": 1, "missing_values": "impute", "classes": None, "class_hashes": [],
                            "label_type": "real", "label_sql_type": "real",
                            "columns": [{"name": "a", "type": "real", "kind": "number", "mean": 0.5,
                                         "missing": False, "levels": [], "hashes": []},
                                        {"name": "b", "type": "integer", "kind": "number", "mean": 2.0,
                                         "missing": False, "levels": [], "hashes": []}]}}

    old_array, old_columns = input_record.of_version(array), input_record.of_version(columns)

    assert old_array.is_array_input and old_array.feature_columns == ("features",) and old_array.input_dim == 8
    assert old_array.split is None and old_array.schema is None
    assert not old_columns.is_array_input and old_columns.columns == (
        Column("a", "real", NUMBER, 0.5), Column("b", "integer", NUMBER, 2.0))
    assert old_columns.identity() == {"source_table": "public.t", "key_column": "id", "target_column": "y",
                                      "task": "regression", "feature_columns": ["a", "b"]}
    with pytest.raises(PgtrainError, match="input_record.of_version"):
        InputRecord.from_json(columns["encoding"])


def test_a_rank_reads_its_source_from_the_record_without_the_catalog(ac, monkeypatch):
    make_mixed_table(ac, 200)
    run = planned_run(ac, world_size=2, exclude_columns=["seen"], **mixed_params())
    planned = input_record.of_run(run)

    def no_catalog(*args, **kwargs):
        raise AssertionError("the catalog was looked up again")

    monkeypatch.setattr(resolve, "resolve_source", no_catalog)
    monkeypatch.setattr(manifest, "source_from_config", no_catalog)
    source = manifest.source_for(ac, run)
    rows = sum(len(loader.load_shard(ac, source, shard, run.input_dim, run.config.validation_fraction,
                                     run.config.seed, test_fraction=run.config.test_fraction).labels)
               for shard in record.get_manifest(ac, run.run_id))

    assert source.feature_columns == planned.columns and source.classes == planned.classes
    assert rows == 200


def test_a_run_planned_before_input_records_is_told_to_plan_again(ac):
    seed_samples(ac, 60, dim=4, classes=2)
    run = planned_run(ac)
    ac.execute("UPDATE pgtrain.training_runs SET encoding = NULL WHERE run_id = %s", (run.run_id,))

    with pytest.raises(PgtrainError, match="re-run the DAG run from compute_shards"):
        manifest.source_for(ac, record.get_run(ac, run.run_id))


def test_a_one_wide_array_version_scores_its_array_as_recorded(ac, db_url):
    seed_samples(ac, 60, dim=1, classes=2)  # one array column of one feature: no width to guess it from
    run = planned_run(ac, model_name="narrow")
    commit(ac, run)

    predictor = load_predictor(db_url, "narrow")

    assert predictor.input.is_array_input and predictor.feature_columns == ("features",)
    assert predictor.inputs([{"features": [0.5]}, {"features": [-2.0]}]).tolist() == [[0.5], [-2.0]]
    assert predictor.predict([{"features": [0.5]}]) == [0]  # zero weights: class 0
