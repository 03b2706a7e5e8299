"""numeric_bins (issue 31) on a real PostgreSQL: the quantile edges planning records are numpy's quantiles of the
training rows' values, per numeric or date column; a plan without them (or of another model) records none, as
before; a warm start keeps its parent's input encoding, edges or none."""

from __future__ import annotations

import datetime

import numpy as np
import pytest

from pgtrain.data import input_record
from pgtrain.data.source.resolve import CATEGORY
from tests.db.test_input_record import commit
from tests.support import make_mixed_table, mixed_params, mixed_rows, planned_run

SPLIT = {"validation_fraction": 0.2, "test_fraction": 0.1, "seed": 5}
BINS = 8
# docs/configuration.md, "The split": the training rows are neither validation nor test rows.
TRAINING_IDS = """SELECT id FROM public.penguins
                  WHERE abs(mod(hashtextextended(id::text, %(seed)s), 1000000))
                        >= round((%(validation_fraction)s + %(test_fraction)s) * 1000000)"""


def numpy_edges(values: list[float]) -> list[float]:
    """percentile_disc's quantiles (numpy's inverted CDF) at 0, 1/BINS, ..., 1, as float32, distinct."""
    quantiles = np.quantile(np.asarray(values, np.float64), np.linspace(0, 1, BINS + 1), method="inverted_cdf")
    return [float(v) for v in np.unique(quantiles.astype(np.float32))]


def test_the_recorded_edges_are_numpys_quantiles_of_the_training_rows(ac):
    make_mixed_table(ac, 400)
    run = planned_run(ac, **mixed_params(numeric_bins=BINS, **SPLIT))
    training = {i for (i,) in ac.execute(TRAINING_IDS, SPLIT)}
    rows = [r for r in mixed_rows(400) if r[0] in training]
    assert 250 < len(rows) < 320
    # the table's columns: id, island, sex, colour, cut, flagged, body_mass, bill, seen, species
    values = {"flagged": [float(r[5]) for r in rows],
              "body_mass": [r[6] for r in rows if r[6] is not None],  # a NULL is no value (its mean is imputed)
              "bill": [float(np.float32(r[7])) for r in rows],  # a real column, read as stored
              "seen": [float((r[8] - datetime.date(1970, 1, 1)).days) for r in rows]}

    columns = {c.name: c for c in input_record.of_run(run).columns}

    for name, found in values.items():
        assert list(columns[name].edges) == numpy_edges(found), name
    assert len(columns["body_mass"].edges) == BINS + 1 and columns["flagged"].edges == (0.0, 1.0)
    assert all(not c.edges for c in columns.values() if c.kind == CATEGORY)
    assert run.input_dim == len(columns) + 1  # the input row is as wide as before: body_mass's "was missing" added


@pytest.mark.parametrize("params", [{}, {"numeric_bins": BINS, "model": "xgboost"}])
def test_a_plan_without_bins_records_no_edges(ac, params):
    make_mixed_table(ac, 200)
    run = planned_run(ac, **mixed_params(**params))
    assert all("edges" not in c for c in run.encoding["columns"])  # the record as before edges
    assert all(not c.edges for c in input_record.of_run(run).columns)


def test_a_warm_start_keeps_its_parents_encoding_edges_or_none(ac):
    make_mixed_table(ac, 300)
    plain = planned_run(ac, "plain", **mixed_params(model_name="plain"))
    commit(ac, plain)
    binned = planned_run(ac, "binned", **mixed_params(model_name="binned", numeric_bins=BINS))
    commit(ac, binned)
    ac.execute("UPDATE public.penguins SET bill = bill * 3")  # the data moved: the parent's edges are kept all the same

    from_plain = planned_run(ac, "from-plain", **mixed_params(model_name="plain", numeric_bins=BINS,
                                                              init_from="head"))
    from_binned = planned_run(ac, "from-binned", **mixed_params(model_name="binned", init_from="head"))

    # the parent's weights are for its inputs: its standardized values, or its bins
    assert all(not c.edges for c in input_record.of_run(from_plain).columns)
    assert input_record.of_run(from_binned).columns == input_record.of_run(binned).columns
    assert any(c.edges for c in input_record.of_run(from_binned).columns)
