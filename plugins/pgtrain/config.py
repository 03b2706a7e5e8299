"""The training configuration: every parameter, its default and its rule, in one place.

The DAG's Airflow params are generated from ``PARAMETERS``; the config snapshot stored with each
run is ``TrainingConfig.from_mapping(params).to_dict()``, and the trainer reads it back from there.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from pgtrain.errors import ConfigError

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")

# name -> JSON schema (with default and description) for the DAG's params.
PARAMETERS: dict[str, dict[str, Any]] = {
    "world_size": {"default": 2, "type": "integer", "minimum": 1, "maximum": 1024,
                   "description": "Horovod ranks (processes; one per GPU on Kubernetes)"},
    "epochs": {"default": 10, "type": "integer", "minimum": 1, "maximum": 10000,
               "description": "passes over the training rows"},
    "batch_size": {"default": 32, "type": "integer", "minimum": 1, "maximum": 1048576,
                   "description": "rows per rank per step (global batch = world_size x batch_size)"},
    "learning_rate": {"default": 0.05, "type": "number", "exclusiveMinimum": 0, "maximum": 10,
                      "description": "SGD learning rate (momentum 0.9)"},
    "hidden_sizes": {"default": [50], "type": "array", "items": {"type": "integer", "minimum": 1},
                     "description": "hidden layer widths of the MLP"},
    "launcher": {"default": "local", "type": "string", "enum": ["local", "kubernetes"],
                 "description": "local: horovodrun on the worker; kubernetes: an MPIJob on GPU pods"},
    "source_table": {"default": "public.samples", "type": "string", "minLength": 1,
                     "description": "table (optionally schema-qualified) holding the training rows"},
    "key_column": {"default": "id", "type": "string", "minLength": 1,
                   "description": "unique, orderable key column used for keyset sharding"},
    "features_column": {"default": "features", "type": "string", "minLength": 1,
                        "description": "real[], double precision[] or bytea (packed little-endian float32)"},
    "label_column": {"default": "label", "type": "string", "minLength": 1,
                     "description": "integer class label in [0, num_classes)"},
    "input_dim": {"default": None, "type": ["integer", "null"], "minimum": 1,
                  "description": "feature length; empty = the most common length among the rows"},
    "num_classes": {"default": None, "type": ["integer", "null"], "minimum": 2,
                    "description": "number of classes; empty = max(label) + 1"},
    "validation_fraction": {"default": 0.1, "type": "number", "minimum": 0, "maximum": 0.5,
                            "description": "share of rows held out for validation, chosen by a hash of the key"},
    "bad_rows": {"default": "fail", "type": "string", "enum": ["fail", "exclude"],
                 "description": "rows with NULL/non-finite values, wrong length or bad labels: fail or skip"},
    "seed": {"default": 0, "type": "integer", "minimum": 0, "description": "initialization and shuffling seed"},
    "model_name": {"default": "digits-mlp", "type": "string", "pattern": _MODEL_NAME.pattern,
                   "description": "the model whose next version this run commits"},
    "max_accuracy_drop": {"default": None, "type": ["number", "null"], "minimum": 0, "maximum": 1,
                          "description": "quality gate: reject if validation accuracy falls more than this "
                                         "below the head's; empty = no gate"},
}


@dataclass(frozen=True)
class TrainingConfig:
    world_size: int = 2
    epochs: int = 10
    batch_size: int = 32
    learning_rate: float = 0.05
    hidden_sizes: tuple[int, ...] = field(default=(50,))
    launcher: str = "local"
    source_table: str = "public.samples"
    key_column: str = "id"
    features_column: str = "features"
    label_column: str = "label"
    input_dim: int | None = None
    num_classes: int | None = None
    validation_fraction: float = 0.1
    bad_rows: str = "fail"
    seed: int = 0
    model_name: str = "digits-mlp"
    max_accuracy_drop: float | None = None

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> TrainingConfig:
        """Build from params (unknown keys are ignored: the DAG may carry launcher settings too)."""
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in known}
        if "hidden_sizes" in kwargs:
            kwargs["hidden_sizes"] = tuple(kwargs["hidden_sizes"])
        config = cls(**kwargs)
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["hidden_sizes"] = list(self.hidden_sizes)
        return data

    def validate(self) -> None:
        problems = []
        for name, schema in PARAMETERS.items():
            if name in {f.name for f in dataclasses.fields(self)}:
                problems += _check(name, getattr(self, name), schema)
        if problems:
            raise ConfigError("invalid training parameters: " + "; ".join(problems))


def _check(name: str, value: Any, schema: dict[str, Any]) -> list[str]:
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if value is None:
        return [] if "null" in types else [f"{name} is required"]
    python_types = {"integer": int, "number": (int, float), "string": str, "array": (list, tuple)}
    if isinstance(value, bool) or not any(isinstance(value, python_types[t]) for t in types if t != "null"):
        return [f"{name}={value!r} should be of type {'/'.join(types)}"]
    problems = []
    if "minimum" in schema and value < schema["minimum"]:
        problems.append(f"{name}={value!r} should be >= {schema['minimum']}")
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        problems.append(f"{name}={value!r} should be > {schema['exclusiveMinimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        problems.append(f"{name}={value!r} should be <= {schema['maximum']}")
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{name}={value!r} should be one of {schema['enum']}")
    if "pattern" in schema and not re.match(schema["pattern"], value):
        problems.append(f"{name}={value!r} should match {schema['pattern']}")
    if schema["type"] == "array":
        if not value:
            problems.append(f"{name} should not be empty")
        for item in value:
            problems += _check(f"{name}[]", item, schema["items"])
    return problems
