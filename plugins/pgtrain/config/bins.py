"""Which quantile bins a plan computes and which a trial records (``numeric_bins``; the edges themselves are
``pgtrain.data.quantiles``'): a search's trials share one plan but may each ask for their own numeric_bins."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pgtrain.config import search
from pgtrain.config.param_schemas import BUILTIN_MLP, MAX_NUMERIC_BINS
from pgtrain.config.training import TrainingConfig
from pgtrain.core.errors import PgtrainError


def bin_counts(config: TrainingConfig) -> tuple[int, ...]:
    """The numeric_bins (> 0, ascending) a plan of ``config`` computes edges for: the built-in mlp's own; with a
    search, those of its mlp candidates (their list of values, else the run's numeric_bins): its trials share the
    plan. A search ``plan_search`` will refuse for its bins (too many, out of range) gets none."""
    if config.search is None:
        return (config.numeric_bins,) if config.model == BUILTIN_MLP and config.numeric_bins > 0 else ()
    mlps = [c for c in config.search.get("candidates") or ()
            if isinstance(c, Mapping) and c.get("model") == BUILTIN_MLP]
    asked = search.bins_asked({"candidates": mlps})
    if any("numeric_bins" not in (c.get("params") or {}) for c in mlps) and config.numeric_bins > 0:
        asked.add(config.numeric_bins)
    return tuple(sorted(asked)) if len(asked) <= search.MAX_BIN_CHOICES and max(asked, default=0) <= MAX_NUMERIC_BINS \
        else ()


def for_bins(encoding: Mapping[str, Any] | None, bins: int, planned: Sequence[int]) -> Mapping[str, Any] | None:
    """A plan's input record (JSON; its edges for the ``planned`` bin counts, ``bin_counts``) as a trial of ``bins``
    (0: none) records it: each column's edges of that B, none of the others'. A warm start's record is kept as it is
    (its weights are for its parent's inputs). PgtrainError for a B the plan has no edges for."""
    columns = (encoding or {}).get("columns") or ()
    if encoding is None or encoding.get("parent_version") is not None or not any("edges" in c for c in columns):
        return encoding
    if bins and bins not in planned:
        raise PgtrainError(f"numeric_bins {bins}: the plan has quantile edges for {list(planned)} only")
    return {**encoding, "columns": [_column_for(c, bins, planned[-1]) for c in columns]}


def _column_for(column: Mapping[str, Any], bins: int, largest: int) -> dict[str, Any]:
    kept = {k: v for k, v in column.items() if k not in ("edges", "bin_edges")}
    # min and max are every B's first and last edges: a column without edges for one B has none for any
    if not bins or "edges" not in column:
        return kept
    return kept | {"edges": column["edges"] if bins == largest else column["bin_edges"][str(bins)]}
