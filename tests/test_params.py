"""One home per param fact: TrainingConfig holds the defaults, PARAMETERS the rules, and they agree."""

from __future__ import annotations

import dataclasses
import types
import typing

import jsonschema
import pytest

from pgtrain.config import params
from pgtrain.config.params import MAX_WORLD_SIZE, PARAMETERS, QUALITY_GATE, TrainingConfig
from pgtrain.config.settings import AUTHOR_PROPERTIES, AuthorSettings, load_settings
from pgtrain.launch.mpijob import cli, spec
from tests.conftest import REPO

FIELDS = {f.name: f for f in dataclasses.fields(TrainingConfig)}
SCHEMAS = {**PARAMETERS, **QUALITY_GATE}
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", tuple: "array",
              type(None): "null"}


def _json_types(annotation: typing.Any) -> set[str]:
    """The JSON types a dataclass annotation allows (``int | None`` -> integer, null)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*(_json_types(part) for part in typing.get_args(annotation)))
    return {JSON_TYPES[typing.get_origin(annotation) or annotation]}


def test_every_field_is_a_param_and_every_param_a_field():
    assert set(FIELDS) == set(SCHEMAS)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_schema_default_is_the_dataclass_default_and_valid(name):
    field = FIELDS[name]
    default = field.default_factory() if field.default is dataclasses.MISSING else field.default
    assert SCHEMAS[name]["default"] == (list(default) if isinstance(default, tuple) else default)
    jsonschema.Draft202012Validator(SCHEMAS[name]).validate(SCHEMAS[name]["default"])


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_schema_type_is_the_dataclass_type(name):
    hints = typing.get_type_hints(TrainingConfig, vars(params))
    declared = SCHEMAS[name].get("type")
    declared = {declared} if isinstance(declared, str) else set(declared or [])
    if not declared:  # anyOf (init_from): each branch's type
        declared = {branch["type"] for branch in SCHEMAS[name]["anyOf"]}
    allowed = _json_types(hints[name])
    assert declared <= allowed | ({"integer"} if "number" in allowed else set()), (name, declared, allowed)


def test_the_rank_limit_is_one_number():
    assert PARAMETERS["world_size"]["maximum"] == MAX_WORLD_SIZE == AuthorSettings().max_world_size
    assert AUTHOR_PROPERTIES["max_world_size"]["maximum"] == MAX_WORLD_SIZE


def test_the_mpijob_defaults_have_one_home():
    """The operator's arguments and the render command's flags default to MPIJobSettings' fields."""
    import inspect

    from pgtrain.airflow.kubernetes.operator import MPIJobOperator

    signature = inspect.signature(MPIJobOperator.__init__).parameters
    for name in ("gpus_per_worker", "database_secret", "worker_cpu", "worker_memory", "launcher_cpu",
                 "launcher_memory", "backoff_limit", "active_deadline_seconds", "ttl_seconds_after_finished"):
        assert signature[name].default == spec.default(name), name
    parser_defaults = {action.dest: action.default for sub in cli.build_parser()._subparsers._group_actions
                       for parser in sub.choices.values() for action in parser._actions}
    assert parser_defaults["worker_cpu"] == spec.default("worker_cpu")
    assert parser_defaults["image"] == spec.default("image")


def test_the_shipped_settings_file_is_valid():
    settings = load_settings(REPO / "dags" / "pgtrain.yaml")
    assert settings.launcher == "local"
    assert AuthorSettings.from_dict(settings.to_dict()) == settings
