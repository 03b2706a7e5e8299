"""The built-in mlp's piecewise-linear encoding of numeric inputs over recorded quantile edges (issue 31): each bin's
value at and between the edges, the input record that carries the edges, and which models get the encoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pgtrain.data import encoding
from pgtrain.data.input_record import _column_json
from pgtrain.data.quantiles import distinct_edges
from pgtrain.data.source.resolve import CATEGORY, NUMBER, Column
from pgtrain.models.network import Encode, Standardize, build_model
from pgtrain.models.piecewise import PiecewiseLinear

EDGES = (0.0, 1.0, 3.0, 7.0)  # three bins: [0, 1], [1, 3], [3, 7]


def encoded(values: list[float]) -> np.ndarray:
    raw = torch.tensor(values, dtype=torch.float32).reshape(-1, 1)
    return PiecewiseLinear([EDGES], 1)(raw, raw).numpy()


@pytest.mark.parametrize(("value", "bins"), [
    (0.0, [0, 0, 0]), (1.0, [1, 0, 0]), (3.0, [1, 1, 0]), (7.0, [1, 1, 1]),  # at the edges
    (0.5, [0.5, 0, 0]), (2.0, [1, 0.5, 0]), (4.0, [1, 1, 0.25]),  # between them
    (-1.0, [-1, 0, 0]), (11.0, [1, 1, 2]),  # outside: the first bin has no lower bound, the last no upper one
])
def test_each_bin_is_zero_before_one_past_and_linear_within(value, bins):
    np.testing.assert_allclose(encoded([value])[0], bins, rtol=0, atol=1e-7)


def test_columns_without_edges_pass_their_standardized_value_after_every_bin():
    layer = PiecewiseLinear([(0.0, 2.0), (), (5.0, 6.0, 8.0)], 4)  # the 4th column (a "was missing" input): none
    raw = torch.tensor([[1.0, 10.0, 7.0, 1.0]])
    standardized = torch.tensor([[-9.0, 0.5, -9.0, 2.0]])
    assert layer.width_out == 1 + 2 + 2
    np.testing.assert_allclose(layer(raw, standardized).numpy(), [[0.5, 1.0, 0.5, 0.5, 2.0]])


def test_the_edges_recorded_are_float32_distinct_and_at_least_two():
    assert distinct_edges([0.1, 0.1, 0.30000001, 0.3, None, 2.0]) == (
        float(np.float32(0.1)), float(np.float32(0.3)), 2.0)
    assert distinct_edges([4.0, 4.0, 4.0]) == ()  # a constant column keeps its standardized value
    assert distinct_edges(None) == ()


def test_a_columns_edges_are_written_only_where_there_are_some():
    binned = Column("size", "double precision", NUMBER, 1.5, True, edges=EDGES)
    plain = Column("rooms", "integer", NUMBER, 2.0)
    written = [_column_json(binned), _column_json(plain)]
    assert written[0]["edges"] == list(EDGES) and "edges" not in written[1]  # an old record stays as it was
    assert encoding.columns_of({"columns": written}) == (binned, plain)


def test_the_layout_widens_each_binned_value_to_its_bins():
    columns = (Column("size", "real", NUMBER, 1.0, True, edges=EDGES), Column("rooms", "integer", NUMBER, 2.0),
               Column("town", "text", CATEGORY, levels=("a", "b"), hashes=(1, 2)))
    layout = encoding.layout(columns)
    assert (layout.width, layout.numeric, layout.sizes, layout.edges) == (4, 3, (4,), (EDGES, ()))
    assert layout.encoded_width == 3 + 1 + 1 + 4  # 3 bins, rooms, size's "was missing", town's 4 codes
    assert encoding.layout(columns[1:]).edges == ()  # no column with edges: as before edges


def record_with(columns: tuple[Column, ...]) -> dict:
    return {"columns": [_column_json(c) for c in columns]}


def test_the_builtin_mlp_bins_its_numeric_inputs_and_another_model_gets_them_standardized():
    columns = (Column("size", "real", NUMBER, 1.0, edges=EDGES), Column("rooms", "integer", NUMBER, 2.0))
    mlp = build_model("mlp", 2, 1, {"hidden_sizes": [4]}, 0, record_with(columns))
    assert isinstance(mlp.normalizer, Encode) and mlp.net[0].in_features == 3 + 1
    assert "normalizer.piecewise.left" not in mlp.state_dict()  # the edges live in the record, not the weights
    plain = build_model("mlp", 2, 1, {"hidden_sizes": [4]}, 0, record_with(tuple(
        Column(c.name, c.type, c.kind, c.mean) for c in columns)))
    assert isinstance(plain.normalizer, Standardize) and plain.net[0].in_features == 2  # as before edges
    assert set(plain.state_dict()) == set(mlp.state_dict())

    seen = {}

    def factory(input_dim: int, output_dim: int) -> nn.Module:
        seen["input_dim"] = input_dim
        return nn.Linear(input_dim, output_dim)

    import sys
    module = type(sys)("pgtrain_test_piecewise_factory")
    module.factory = factory
    sys.modules[module.__name__] = module
    try:
        build_model(f"{module.__name__}:factory", 2, 1, {}, 0, record_with(columns))
    finally:
        del sys.modules[module.__name__]
    assert seen["input_dim"] == 2  # a user's model is given the standardized values it always was


def test_binned_inputs_with_categories_score_alike_by_the_one_hot_and_the_sparse_first_layer():
    columns = (Column("size", "real", NUMBER, 1.0, True, edges=EDGES), Column("rooms", "integer", NUMBER, 2.0),
               Column("town", "text", CATEGORY, levels=("a", "b"), hashes=(1, 2)))
    model = build_model("mlp", 4, 2, {"hidden_sizes": [5]}, 3, record_with(columns))
    x = torch.tensor([[0.5, 2.0, 0.0, 3.0], [5.0, 1.0, 1.0, 0.0], [-2.0, 4.0, 0.0, 2.0]])
    with torch.no_grad():
        sparse = model.standardized(x)  # embedding_bag over the codes
        dense = model.net(model.normalizer(x))  # the one-hot block built
    np.testing.assert_allclose(sparse.numpy(), dense.numpy(), rtol=1e-6, atol=1e-6)
