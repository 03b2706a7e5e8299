"""The one converter of version records (``model_versions.spec``) written by an earlier pgtrain into the shape the
current one writes (``store.commit_checks.version_spec``). Every reader of a version's spec reads it through
``current_record``, so that no other code keeps a branch for an old shape; data that must be rewritten in place is
a migration's job (``sql/``).

The shapes it converts, as they were written:

- versions from before encodings (and array-feature versions): no ``encoding`` key; their input is their features
  as they are (``None``),
- versions from before the collectives layer: no ``backend``; Horovod was the only backend then,
- built-in mlp versions from before its ``dropout`` and ``normalization`` options: ``model_options`` holds
  ``hidden_sizes`` only; they were built with no dropout and no normalization (recorded here, so that a later
  change of the mlp's defaults cannot rebuild them differently),
- versions whose spec migration 004 wrote from their run: as the above, with every other key present.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# What the mlp was built with before its spec recorded these options (pgtrain.models.network.mlp then).
MLP_OPTIONS_BEFORE_RECORDED = {"dropout": 0.0, "normalization": "none"}
BACKEND_BEFORE_RECORDED = "horovod"


def current_record(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """``spec`` in the current shape (a new dict; ``{}`` for a version that records none). Idempotent: a current
    record comes back equal."""
    if not spec:
        return {}
    record = dict(spec)
    record.setdefault("encoding", None)
    record.setdefault("backend", BACKEND_BEFORE_RECORDED)
    if record.get("model") == "mlp":
        record["model_options"] = {**MLP_OPTIONS_BEFORE_RECORDED, **(record.get("model_options") or {})}
    return record
