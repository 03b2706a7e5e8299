"""The one converter of version records (pgtrain.data.upgrade.current_record), fed the records earlier pgtrain
wrote: migration 004's spec of a version made before specs, version_spec before encodings (its mlp options
hidden_sizes only), and version_spec before the collectives backend was recorded."""

from __future__ import annotations

import pytest

from pgtrain.data.upgrade import current_record
from pgtrain.models.spec import ModelSpec

WATERMARK = {"snapshot": "742:742:", "max_key": "1999"}
# sql/004_chunked_tensors.sql: jsonb_build_object(...) of the run, for versions committed before specs existed
FROM_MIGRATION_004 = {
    "model": "mlp", "model_options": {"hidden_sizes": [32, 16]}, "input_dim": 64, "output_dim": 10,
    "feature_columns": ["pixels"], "target_column": "digit", "task": "classification",
    "standardize_target": False, "parent_version": None, "source_table": "public.samples", "key_column": "id",
    "watermark": WATERMARK,
}
# store/commit_checks.version_spec before encodings (commit d221d6e~1): scalar columns, mlp options hidden_sizes only
BEFORE_ENCODINGS = {
    "model": "mlp", "model_options": {"hidden_sizes": [8]}, "input_dim": 3, "output_dim": 1,
    "feature_columns": ["a", "b", "c"], "target_column": "y", "task": "regression", "standardize_target": True,
    "parent_version": 2, "source_table": "public.houses", "key_column": "id", "watermark": WATERMARK,
}
# version_spec before the collectives layer (commit 69f03b6~1): an encoding, no backend
BEFORE_BACKENDS = {
    "model": "mlp", "model_options": {"hidden_sizes": [8], "dropout": 0.1, "normalization": "layer"},
    "input_dim": 2, "output_dim": 2, "feature_columns": ["a", "colour"],
    "encoding": {"format": 1, "missing_values": "impute", "classes": None, "class_hashes": [], "columns": []},
    "target_column": "y", "task": "classification", "standardize_target": False, "parent_version": None,
    "source_table": "public.t", "key_column": "id", "watermark": WATERMARK,
}
# what version_spec writes today
CURRENT = {**BEFORE_BACKENDS, "backend": "torch"}


@pytest.mark.parametrize("old", [FROM_MIGRATION_004, BEFORE_ENCODINGS, BEFORE_BACKENDS],
                         ids=["migration_004", "before_encodings", "before_backends"])
def test_a_record_of_an_earlier_pgtrain_comes_back_with_every_key_the_current_one_writes(old):
    record = current_record(old)
    assert set(record) == set(CURRENT)
    assert {k: v for k, v in record.items() if k not in ("encoding", "backend", "model_options")} == {
        k: v for k, v in old.items() if k not in ("encoding", "backend", "model_options")}, "what it recorded stays"
    assert current_record(record) == record, "converting twice changes nothing"


def test_what_an_earlier_record_leaves_out_is_what_its_version_was_trained_with():
    before_encodings = current_record(BEFORE_ENCODINGS)
    assert before_encodings["encoding"] is None, "its input is its features as they are"
    assert before_encodings["backend"] == "horovod", "the only backend before backends were recorded"
    assert before_encodings["model_options"] == {"hidden_sizes": [8], "dropout": 0.0, "normalization": "none"}
    assert current_record(BEFORE_BACKENDS)["model_options"] == BEFORE_BACKENDS["model_options"], "recorded: kept"
    assert current_record(BEFORE_BACKENDS)["encoding"] == BEFORE_BACKENDS["encoding"]


def test_a_current_record_comes_back_equal_and_a_missing_one_as_empty():
    assert current_record(CURRENT) == CURRENT
    assert current_record(None) == {} and current_record({}) == {}
    user_factory = {**CURRENT, "model": "package.module:factory", "model_options": {"width": 3}}
    assert current_record(user_factory)["model_options"] == {"width": 3}, "only the mlp's options are filled in"


def test_a_version_of_migration_004_rebuilds_with_the_tensors_it_was_committed_with():
    """Its mlp is rebuilt as it was built then, whatever the mlp's defaults are now."""
    from pgtrain.models.network import build_model, state_layout

    record = current_record(FROM_MIGRATION_004)
    model = build_model(record["model"], record["input_dim"], record["output_dim"], record["model_options"], seed=0,
                        encoding=record["encoding"], task=record["task"])
    stored = ModelSpec(64, (32, 16), 10).parameter_shapes()
    assert {name: tuple(t["shape"]) for name, t in state_layout(model).items()} == stored
