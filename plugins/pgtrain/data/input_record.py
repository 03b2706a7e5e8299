"""The input record: what a run (and the version it becomes) learns from, and how its rows become tensors.

One frozen record, resolved once in the planning snapshot (``manifest.plan_shards``): the source (as configured
and as the catalog resolved it), key, target and task; the features (one array column, or scalar columns with
their kinds, levels or hashes, means and "was missing" inputs: ``pgtrain.data.encoding``); the classes; the widths
of an input row and of the output; and the split rule. It is stored with the run (``training_runs.encoding``),
copied verbatim into the version (its spec's ``encoding``), and read back through ``from_json`` by the ranks, the
commit, ``load_predictor`` and ``predict``. Its JSON keeps the keys of the encoding it extends, so what reads an
encoding (``encoding.columns_of``, ``encoding.layout_of``) reads a record as well.

A version committed before input records holds a spec and maybe an encoding (scalar-column versions and those
with classes only): ``of_version`` reads either, through the one converter of those, ``from_version``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pgtrain.config.params import TrainingConfig
from pgtrain.core.errors import PgtrainError
from pgtrain.data import encoding
from pgtrain.data.source.resolve import COLUMNS, NUMBER, Column, Source
from pgtrain.runs.record import Run

if TYPE_CHECKING:
    from pgtrain.data.source.planned import PlannedRows

FORMAT = 2  # 1 (before input records): the encoding alone, for scalar columns or classes


@dataclass(frozen=True)
class Split:
    """The rule that picks a row's part by a hash of its key (``pgtrain.data.source.rows.split_part``)."""

    validation_fraction: float
    test_fraction: float
    seed: int


@dataclass(frozen=True)
class InputRecord:
    source_table: str | None  # as configured (what the model's data identity names)
    schema: str | None  # as the catalog resolved it; None: a version from before input records
    table: str | None
    key_column: str | None
    key_type: str | None  # with its modifiers (character(8), ...)
    target_column: str | None
    task: str
    label_type: str  # format_type without modifiers
    label_sql_type: str  # with modifiers (character(1), an enum's name): the type of predictions
    feature_format: str  # COLUMNS, float4_array, float8_array or bytea
    features_column: str | None  # the array (or bytea) column; None for scalar columns
    columns: tuple[Column, ...]  # the scalar feature columns in input order, as encoded; () for an array
    missing_values: str
    classes: tuple[str, ...] | None  # a class list's classes (text forms) in class order; None: class numbers
    class_hashes: tuple[int, ...]
    input_dim: int  # columns of an input row
    output_dim: int  # classes, or the regression target's width
    split: Split | None  # None: a version from before input records
    parent_version: int | None = None  # the version a warm start began from (and took its encoding from)

    @property
    def is_array_input(self) -> bool:
        """Whether the features are one array (or packed float32 bytea) column rather than scalar columns."""
        return self.feature_format != COLUMNS

    @property
    def feature_columns(self) -> tuple[str, ...]:
        """The columns the input is made of, in order (an array's one column)."""
        return (self.features_column,) if self.is_array_input else tuple(c.name for c in self.columns)

    @property
    def num_classes(self) -> int | None:
        return self.output_dim if self.task == "classification" else None

    def identity(self) -> dict[str, Any]:
        """The model's data identity (``pgtrain.store.identity``): a fact None is one not recorded."""
        return {"source_table": self.source_table, "key_column": self.key_column,
                "target_column": self.target_column, "task": self.task,
                "feature_columns": list(self.feature_columns) if self.feature_columns else None}

    def source(self, plan: PlannedRows | None = None) -> Source:
        """The planned source, as the loader reads it, without looking the catalog up again (``plan``: its
        ``PlannedRows``)."""
        if self.schema is None or self.table is None or self.key_column is None or self.key_type is None:
            raise PgtrainError(f"the input record of {self.source_table!r} was converted from before input records: "
                               "it names no resolved table to read; plan a run to read the table")
        return Source(self.schema, self.table, self.key_column, self.features_column, self.target_column,
                      self.key_type, self.feature_format, plan=plan, feature_columns=self.columns, task=self.task,
                      label_type=self.label_type, classes=self.classes, class_hashes=self.class_hashes,
                      missing_values=self.missing_values, label_sql_type=self.label_sql_type)

    # -- JSON -----------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "source_table": self.source_table, "schema": self.schema, "table": self.table,
                "key_column": self.key_column, "key_type": self.key_type, "target_column": self.target_column,
                "task": self.task, "label_type": self.label_type, "label_sql_type": self.label_sql_type,
                "feature_format": self.feature_format, "features_column": self.features_column,
                "columns": [_column_json(c) for c in self.columns], "missing_values": self.missing_values,
                "classes": list(self.classes) if self.classes is not None else None,
                "class_hashes": [str(h) for h in self.class_hashes], "input_dim": self.input_dim,
                "output_dim": self.output_dim, "split": asdict(self.split) if self.split is not None else None,
                "parent_version": self.parent_version}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InputRecord:
        """The record ``to_json`` wrote; PgtrainError for anything else (an older version's spec: ``of_version``)."""
        found = data.get("format") if isinstance(data, Mapping) else None
        if found != FORMAT:
            raise PgtrainError(f"not an input record of format {FORMAT} (format {found!r}); a version from before "
                               "input records is read with input_record.of_version")
        split = data["split"]
        return cls(data["source_table"], data["schema"], data["table"], data["key_column"], data["key_type"],
                   data["target_column"], data["task"], data["label_type"], data["label_sql_type"],
                   data["feature_format"], data["features_column"], encoding.columns_of(data),
                   data["missing_values"], tuple(data["classes"]) if data["classes"] is not None else None,
                   tuple(int(h) for h in data["class_hashes"]), int(data["input_dim"]), int(data["output_dim"]),
                   Split(**split) if split is not None else None, data["parent_version"])

    # -- building -------------------------------------------------------------------------------------------
    @classmethod
    def planned(cls, source: Source, config: TrainingConfig, input_dim: int, output_dim: int,
                parent_version: int | None) -> InputRecord:
        """The record of a source as planning resolved and encoded it."""
        return cls(config.source_table, source.schema, source.table, source.key_column, source.key_type,
                   source.label_column, source.task, source.label_type, source.label_sql_type,
                   source.feature_format, source.features_column,
                   source.feature_columns if source.feature_format == COLUMNS else (), source.missing_values,
                   source.classes, source.class_hashes, input_dim, output_dim,
                   Split(config.validation_fraction, config.test_fraction, config.seed), parent_version)

    @classmethod
    def from_version(cls, spec: Mapping[str, Any], recorded: Mapping[str, Any] | None,
                     types: Mapping[str, str] | None = None) -> InputRecord:
        """The record of a version committed before input records, from its spec and its encoding (format 1:
        scalar-column versions and those with classes; None for others). A version from before encodings took its
        scalar columns as numbers as they are (a NULL was a bad row), typed as ``types`` has them (a source's
        column types now; else double precision), and its integer labels as class numbers; one array column was
        its input when it recorded one feature column for a wider input."""
        recorded = recorded or {}
        names = tuple(spec.get("feature_columns") or ())
        width = int(spec.get("input_dim") or 0)
        columns = encoding.columns_of(recorded)
        array = not columns and len(names) == 1 and width > 1
        if not columns and not array:
            columns = tuple(Column(name, (types or {}).get(name, "double precision"), NUMBER) for name in names)
        task = spec.get("task") or "classification"
        classes = recorded.get("classes")
        return cls(spec.get("source_table"), None, None, spec.get("key_column"), None, spec.get("target_column"),
                   task, recorded.get("label_type") or ("integer" if task == "classification" else ""),
                   recorded.get("label_sql_type") or "", "float4_array" if array else COLUMNS,
                   names[0] if array else None, () if array else columns,
                   recorded.get("missing_values") or "bad_row", tuple(classes) if classes is not None else None,
                   tuple(int(h) for h in recorded.get("class_hashes") or ()), width,
                   int(spec.get("output_dim") or 0), None, spec.get("parent_version"))


def _column_json(column: Column) -> dict[str, Any]:
    found = {**asdict(column), "levels": list(column.levels), "hashes": list(column.hashes)}
    del found["edges"], found["bin_edges"]  # written only where there are some: a record without them is as before
    return found | ({"edges": list(column.edges)} if column.edges else {}) | (
        {"bin_edges": {str(b): list(e) for b, e in column.bin_edges}} if column.bin_edges else {})


def of_version(spec: Mapping[str, Any], types: Mapping[str, str] | None = None) -> InputRecord:
    """A version's input record: the one it holds, or (a version from before input records) ``from_version``."""
    recorded = spec.get("encoding")
    if recorded and recorded.get("format") == FORMAT:
        return InputRecord.from_json(recorded)
    return InputRecord.from_version(spec, recorded, types)


def of_run(run: Run) -> InputRecord:
    """A run's input record, as compute_shards planned it; a run planned before input records (an encoding of
    format 1, or none) through ``from_version``, with the facts its version's spec would have recorded."""
    if run.encoding and run.encoding.get("format") == FORMAT:
        return InputRecord.from_json(run.encoding)
    config = run.config
    names = config.feature_columns if isinstance(config.feature_columns, tuple) else (config.array_features_column,)
    return InputRecord.from_version(
        {"source_table": config.source_table, "key_column": config.key_column, "target_column": config.label_column,
         "task": config.task, "feature_columns": list(names), "input_dim": run.input_dim,
         "output_dim": run.output_dim or run.num_classes}, run.encoding)
