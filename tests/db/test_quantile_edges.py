"""numeric_bins (issue 31) on a real PostgreSQL: the quantile edges planning records are numpy's quantiles of the
training rows' values, per numeric or date column; a plan without them (or of another model) records none, as
before; a warm start keeps its parent's input encoding, edges or none."""

from __future__ import annotations

import datetime

import numpy as np
import pytest

from pgtrain.config.params import TrainingConfig
from pgtrain.config.settings import AuthorSettings
from pgtrain.data import input_record
from pgtrain.data.encoding import layout_of
from pgtrain.data.source.resolve import CATEGORY
from pgtrain.models.network import build_model, state_layout
from pgtrain.planning import plan
from pgtrain.planning.plan import admit_run, author_admitting, plan_shards_checked
from pgtrain.runs import record
from pgtrain.store import model_store
from pgtrain.store.inference import load_predictor
from pgtrain.store.tensors import write_staged
from tests.support import make_mixed_table, mixed_params, mixed_rows, planned_run

SPLIT = {"validation_fraction": 0.2, "test_fraction": 0.1, "seed": 5}
BINS = 8
COLUMNS = ("id", "island", "sex", "colour", "cut", "flagged", "body_mass", "bill", "seen", "species")
# docs/configuration.md, "The split": the training rows are neither validation nor test rows.
TRAINING_IDS = """SELECT id FROM public.penguins
                  WHERE abs(mod(hashtextextended(id::text, %(seed)s), 1000000))
                        >= round((%(validation_fraction)s + %(test_fraction)s) * 1000000)"""


def numpy_edges(values: list[float], bins: int = BINS) -> list[float]:
    """percentile_disc's quantiles (numpy's inverted CDF) at 0, 1/bins, ..., 1, as float32, distinct."""
    quantiles = np.quantile(np.asarray(values, np.float64), np.linspace(0, 1, bins + 1), method="inverted_cdf")
    return [float(v) for v in np.unique(quantiles.astype(np.float32))]


def commit_built(conn, run: record.Run) -> None:
    """Commit the run's model as built (untrained): a version that loads."""
    model = build_model(run.config.model, run.input_dim, run.output_dim, run.config.model_options_for_build,
                        run.config.seed, run.encoding)
    record.set_model_layout(conn, run.run_id, state_layout(model))
    write_staged(conn, run.run_id, {n: t.numpy() for n, t in model.state_dict().items()})
    record.record_epoch(conn, run.run_id, 1, {"train_loss": 1.0, "val_loss": 1.0, "val_accuracy": 0.5,
                                              "seconds": 0.1})
    model_store.commit_run(conn, run.run_id, owner={"task_id": "test"})


def training_values(conn) -> dict[str, list[float]]:
    """Each numeric or date column's values in public.penguins' training rows (``SPLIT``), as planning sees them."""
    training = {i for (i,) in conn.execute(TRAINING_IDS, SPLIT)}
    rows = [r for r in mixed_rows(400) if r[0] in training]
    assert 250 < len(rows) < 320
    # the table's columns: id, island, sex, colour, cut, flagged, body_mass, bill, seen, species
    return {"flagged": [float(r[5]) for r in rows],
            "body_mass": [r[6] for r in rows if r[6] is not None],  # a NULL is no value (its mean is imputed)
            "bill": [float(np.float32(r[7])) for r in rows],  # a real column, read as stored
            "seen": [float((r[8] - datetime.date(1970, 1, 1)).days) for r in rows]}


def test_the_recorded_edges_are_numpys_quantiles_of_the_training_rows(ac):
    make_mixed_table(ac, 400)
    run = planned_run(ac, **mixed_params(numeric_bins=BINS, **SPLIT))
    values = training_values(ac)

    columns = {c.name: c for c in input_record.of_run(run).columns}

    for name, found in values.items():
        assert list(columns[name].edges) == numpy_edges(found), name
    assert len(columns["body_mass"].edges) == BINS + 1 and columns["flagged"].edges == (0.0, 1.0)
    assert all(not c.edges for c in columns.values() if c.kind == CATEGORY)
    assert run.input_dim == len(columns) + 1  # the input row is as wide as before: body_mass's "was missing" added


def test_a_searchs_trials_each_record_exactly_the_edges_of_their_own_numeric_bins(ac):
    """One plan for trials of numeric_bins 0, 5 and 8 (5 does not divide 8): each trial's record holds numpy's edges of
    its own B (what a plan of that B alone records), none for 0 nor for xgboost, and nothing of the others'."""
    make_mixed_table(ac, 400)
    search = {"candidates": [{"model": "mlp", "params": {"numeric_bins": [0, 5, BINS]}}, {"model": "xgboost"}]}
    run = planned_run(ac, "search", **mixed_params(model_name="binned-search", search=search, **SPLIT))
    author = AuthorSettings(allowed_models=("mlp", "xgboost"), search_limits={"max_trials": 4})
    runs = plan.plan_trials(ac, run.run_id, author)
    values = training_values(ac)
    alone = planned_run(ac, "alone", **mixed_params(model_name="alone", numeric_bins=5, **SPLIT))

    records = [record.get_run(ac, r).encoding for r in runs]
    for encoding, bins in zip(records, [0, 5, BINS, 0], strict=True):
        columns = {c["name"]: c for c in encoding["columns"]}
        assert all("bin_edges" not in c for c in columns.values())
        if not bins:
            assert all("edges" not in c for c in columns.values())
            continue
        for name, found in values.items():
            assert columns[name]["edges"] == numpy_edges(found, bins), (bins, name)
        assert {n for n, c in columns.items() if "edges" in c} == set(values)
    assert records[1] == alone.encoding  # the 5-bin trial's record is a 5-bin plan's own
    assert records[0] == {**records[1], "columns": records[3]["columns"]}  # the rest of the record: the plan's
    # the trials' widths are their own: 5 or 8 bins per column with edges, the standardized value for 0
    widths = [layout_of(e).encoded_width for e in records]
    assert widths[0] == widths[3] < widths[1] < widths[2]


def test_a_search_run_of_another_model_still_plans_its_mlp_candidates_bins(ac):
    """The search run's own model does not train (its trials' models do): an mlp candidate's bins are planned under a
    search run whose model is xgboost."""
    make_mixed_table(ac, 400)
    search = {"candidates": [{"model": "mlp", "params": {"numeric_bins": [BINS]}}, {"model": "xgboost"}]}
    run = planned_run(ac, "search", **mixed_params(model_name="xgb-search", model="xgboost", search=search, **SPLIT))
    author = AuthorSettings(allowed_models=("mlp", "xgboost"), search_limits={"max_trials": 4})
    binned, boosted = (record.get_run(ac, r).encoding for r in plan.plan_trials(ac, run.run_id, author))
    values = training_values(ac)
    assert {c["name"]: c["edges"] for c in binned["columns"] if "edges" in c} == \
        {name: numpy_edges(found, BINS) for name, found in values.items()}
    assert all("edges" not in c for c in boosted["columns"])


@pytest.mark.parametrize("params", [{}, {"numeric_bins": BINS, "model": "xgboost"}])
def test_a_plan_without_bins_records_no_edges(ac, params):
    make_mixed_table(ac, 200)
    run = planned_run(ac, **mixed_params(**params))
    assert all("edges" not in c for c in run.encoding["columns"])  # the record as before edges
    assert all(not c.edges for c in input_record.of_run(run).columns)


def test_a_warm_start_keeps_its_parents_encoding_edges_or_none(ac):
    make_mixed_table(ac, 300)
    plain = planned_run(ac, "plain", **mixed_params(model_name="plain"))
    commit_built(ac, plain)
    binned = planned_run(ac, "binned", **mixed_params(model_name="binned", numeric_bins=BINS))
    commit_built(ac, binned)
    ac.execute("UPDATE public.penguins SET bill = bill * 3")  # the data moved: the parent's edges are kept all the same

    config = TrainingConfig.from_mapping(mixed_params(model_name="plain", numeric_bins=BINS, init_from="head"))
    author = author_admitting(ac, config)
    admitted = admit_run(ac, config, author, "pgtrain_test", "from-plain")
    warnings = plan_shards_checked(ac, admitted.run_id, author).warnings
    from_plain = record.get_run(ac, admitted.run_id)
    from_binned = planned_run(ac, "from-binned", **mixed_params(model_name="binned", init_from="head"))

    # the parent's weights are for its inputs: its standardized values, or its bins
    assert all(not c.edges for c in input_record.of_run(from_plain).columns)
    assert any("numeric_bins 8: the version this run starts from has standardized numeric inputs" in w
               for w in warnings), warnings
    old = load_predictor(ac, "plain")  # a version without edges loads and scores as before
    assert old.model.normalizer.piecewise is None
    assert old.model.net[0].in_features == layout_of(from_plain.encoding).encoded_width
    assert len(old.predict([dict(zip(COLUMNS, mixed_rows(1)[0], strict=True))])) == 1
    assert input_record.of_run(from_binned).columns == input_record.of_run(binned).columns
    assert any(c.edges for c in input_record.of_run(from_binned).columns)


def test_bad_rows_left_out_are_left_out_of_the_edges(ac):
    make_mixed_table(ac, 300)
    bad = [(1000 + i, *row[1:6], 1e6, *row[7:9], None) for i, row in enumerate(mixed_rows(40, seed=1))]
    with ac.cursor() as cur:  # a NULL label makes a bad row; their body mass lies far above every other
        cur.executemany("INSERT INTO public.penguins VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", bad)

    run = planned_run(ac, **mixed_params(numeric_bins=BINS, bad_rows="exclude", **SPLIT))

    body_mass = {c.name: c for c in input_record.of_run(run).columns}["body_mass"]
    assert len(body_mass.edges) == BINS + 1 and body_mass.edges[-1] < 1e5
