"""What of a categorical column's levels a version stores in clear, by the DAG author's rules
(``pgtrain.config.params.CATEGORY_STORAGE``, admitted into the run's config by ``pgtrain.data.policy.admit``).

A level is stored as its 64-bit hash alone, with its *digest* (``hash:`` and the hash in hex) where its text
would be, when its column is one of ``hashed_columns``, when its column keeps more than ``max_clear_levels``
levels, or when it is longer than ``max_level_length`` characters. Scoring needs only the hashes
(``pgtrain.data.encoding``): the loader and ``predict`` get them from PostgreSQL, ``load_predictor`` computes
them (``pgtrain.data.text_hash``), so a hashed level scores exactly as a clear one.

A hash is not encryption: a value from a small space (a birth date, a social security number) can be found by
hashing every candidate. Leave such a column out (``exclude_columns``) when nothing derived from it may be
stored.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pgtrain.config.params import TrainingConfig
from pgtrain.data.source.resolve import CATEGORY, Column, Source

DIGEST_PREFIX = "hash:"
_UINT64 = (1 << 64) - 1


def digest(hashed: int) -> str:
    """What a level stored as its hash shows where its text would be."""
    return f"{DIGEST_PREFIX}{hashed & _UINT64:016x}"


def is_hashed(level: str, hashed: int) -> bool:
    """Whether a recorded level is stored as its hash only (its text is its own hash's digest)."""
    return level == digest(hashed)


def stored(source: Source, config: TrainingConfig) -> Source:
    """``source`` with every categorical level the author's rules keep out of clear replaced by its digest."""
    return replace(source, feature_columns=tuple(_stored(c, config) if c.kind == CATEGORY else c
                                                 for c in source.feature_columns))


def class_problem(source: Source, config: TrainingConfig) -> str | None:
    """Why a classification's classes may not be stored, or None. Classes are stored in clear (``predict`` writes
    the label in its own type), so the author's rules for clear levels bound them too: a label among the
    ``hashed_columns``, more classes than ``max_clear_levels`` or a class longer than ``max_level_length`` is
    refused (a triggerer picks the label: the class names would hold whatever column it picked)."""
    classes, label = source.classes or (), source.label_column
    rules = "the DAG author's settings"
    if label in config.hashed_columns:
        return (f"label_column {label!r} is one of the hashed_columns, whose values are never stored in clear, but "
                f"a classification stores its classes in clear (categories.hashed_columns, {rules}): choose another "
                "label_column")
    if len(classes) > config.max_clear_levels:
        return (f"label_column {label!r} has {len(classes):,} classes, more than the {config.max_clear_levels:,} "
                f"levels a version may store in clear (categories.max_clear_levels, {rules}): is it a key or a "
                "regression target? choose another label_column, or ask the author to raise it")
    long = [c for c in classes if len(c) > config.max_level_length]
    if long:
        return (f"label_column {label!r} has {len(long):,} classes longer than {config.max_level_length} characters "
                f"(categories.max_level_length, {rules}), which a version would store in clear: choose another "
                "label_column, or ask the author to raise it")
    return None


def _stored(column: Column, config: TrainingConfig) -> Column:
    hidden = column.name in config.hashed_columns or len(column.levels) > config.max_clear_levels
    return replace(column, levels=tuple(
        digest(hashed) if hidden or len(level) > config.max_level_length else level
        for level, hashed in zip(column.levels, column.hashes, strict=True)))


def described(column: Column) -> dict[str, Any]:
    """How many of a categorical column's levels are stored in clear and how many as hashes."""
    hashed = sum(is_hashed(level, h) for level, h in zip(column.levels, column.hashes, strict=True))
    return {"levels": len(column.levels), "clear": len(column.levels) - hashed, "hashed": hashed}


def summary(column: Column) -> str:
    """One line on what a version stores of a categorical column's levels (``pgtrain-models show``)."""
    counts = described(column)
    if not counts["hashed"]:
        return f"{counts['levels']:,} levels in clear"
    if not counts["clear"]:
        return f"{counts['levels']:,} levels stored as hashes only (shown as {DIGEST_PREFIX}...)"
    return (f"{counts['levels']:,} levels: {counts['clear']:,} in clear, {counts['hashed']:,} stored as hashes only "
            f"(shown as {DIGEST_PREFIX}...)")
