"""One home per param fact: TrainingConfig holds the defaults, PARAMETERS the rules, and they agree."""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing

import jsonschema
import pytest

from pgtrain.config import kubernetes, params
from pgtrain.config.params import (
    CATEGORY_STORAGE,
    MAX_WORLD_SIZE,
    PARAMETERS,
    QUALITY_GATE,
    RANK_SETTINGS,
    TrainingConfig,
)
from pgtrain.config.settings import AUTHOR_PROPERTIES, AuthorSettings, load_settings
from pgtrain.core.errors import ConfigError
from tests.conftest import REPO

FIELDS = {f.name: f for f in dataclasses.fields(TrainingConfig)}
SCHEMAS = {**PARAMETERS, **QUALITY_GATE, **CATEGORY_STORAGE, **RANK_SETTINGS}
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


def test_the_shipped_settings_file_is_valid():
    settings = load_settings(REPO / "dags" / "pgtrain.yaml")
    assert settings.launcher == "local"
    assert AuthorSettings.from_dict(settings.to_dict()) == settings


def _doc_rows(doc: str, header: str) -> list[tuple[list[str], list[str]]]:
    """(names, defaults) of each row of the table under ``header`` in a docs page: backticked names in the column
    before ``default``, the defaults in the ``default`` column split at top-level commas."""
    lines = (REPO / "docs" / doc).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|") and header in line)
    columns = [c.strip() for c in lines[start].strip("|").split("|")]
    at = columns.index("default")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = re.findall(r"`([a-z_]+)`", cells[at - 1])
        defaults = [d.strip() for d in re.split(r",\s*(?![^\[{]*[\]}])", cells[at].split(" (")[0])]
        rows.append((names, defaults))
    return rows


def _documented(text: str) -> object:
    text = text.strip("`")
    words = {"none": None, "auto": None, "from the data": None, "true": True, "false": False}
    if text in words:
        return words[text]
    try:
        return json.loads(text)
    except ValueError:
        return text


@pytest.mark.parametrize(("doc", "header", "defaults"), [
    ("configuration.md", "| section | param | default |", lambda name: PARAMETERS[name]["default"]),
    ("kubernetes.md", "| setting | default |", lambda name: kubernetes.default(name)),
])
def test_the_docs_tables_state_the_defaults_the_code_has(doc, header, defaults):
    checked = 0
    for names, values in _doc_rows(doc, header):
        if len(names) != len(values):
            continue
        for name, value in zip(names, values, strict=True):
            try:
                expected = defaults(name)
            except KeyError:
                continue  # not a field with a default of its own (e.g. service_account_name)
            if name == "model_name" or _documented(value) is None and expected is None:
                checked += 1
                continue
            expected = list(expected) if isinstance(expected, tuple) else expected
            documented = value.strip("`") if isinstance(expected, str) else _documented(value)
            assert documented == expected, f"docs/{doc}: {name} is documented as {value}, not {expected!r}"
            checked += 1
    assert checked >= 8, f"docs/{doc}: the defaults table was not found or not read"


def test_the_settings_file_refuses_a_launcher_it_does_not_know(tmp_path):
    from pgtrain.core.errors import ConfigError

    path = tmp_path / "pgtrain.yaml"
    path.write_text("launcher: slurm\n")
    with pytest.raises(ConfigError, match=r"pgtrain\.yaml: launcher: 'slurm' is not one of \['local', 'kubernetes'\]"):
        load_settings(path)


@pytest.mark.parametrize(("gate", "words"), [
    ("{metric: val_auc, max_drop: 0.01}", r"quality_gate\.metric: 'val_auc' is not one of"),
    ("{max_drop: 0.01}", r"quality_gate\.max_drop: needs metric, the metric it judges"),
    ("{floor: 0.9, metric: null}", r"quality_gate\.floor: needs metric"),
    ("{metric: val_loss, max_drop: -1}", r"quality_gate\.max_drop: -1 is less than the minimum of 0"),
])
def test_the_settings_file_refuses_a_gate_that_judges_nothing(tmp_path, gate, words):
    from pgtrain.core.errors import ConfigError

    path = tmp_path / "pgtrain.yaml"
    path.write_text(f"quality_gate: {gate}\n")
    with pytest.raises(ConfigError, match=words):
        load_settings(path)


def test_a_gate_on_any_metric_reads_back_and_must_fit_the_run_s_task(tmp_path):
    from pgtrain.core.errors import ConfigError

    path = tmp_path / "pgtrain.yaml"
    path.write_text("quality_gate: {metric: val_roc_auc, max_drop: 0.01, floor: 0.7}\n")
    gate = load_settings(path).quality_gate
    config = dataclasses.replace(TrainingConfig(), **gate)
    assert (config.metric, config.max_drop, config.floor) == ("val_roc_auc", 0.01, 0.7)
    assert TrainingConfig.from_mapping(config.to_dict()) == config
    with pytest.raises(ConfigError, match="val_roc_auc is a classification metric, and the run's task is regression"):
        dataclasses.replace(TrainingConfig(task="regression"), **gate)


def test_naming_no_settings_file_at_all_is_an_error_not_silent_defaults(monkeypatch, tmp_path):
    from pgtrain.core.errors import ConfigError

    monkeypatch.delenv("PGTRAIN_SETTINGS", raising=False)
    with pytest.raises(ConfigError, match=r"which pgtrain settings file\? Pass its path, or set \$PGTRAIN_SETTINGS"):
        load_settings()
    assert load_settings(default=tmp_path / "absent.yaml") == AuthorSettings()  # a DAG's own file may be absent


def test_validation_and_test_fractions_that_hold_out_every_row_are_refused_before_planning():
    with pytest.raises(ConfigError, match=r"validation_fraction 0\.5 and test_fraction 0\.5 hold out every row"):
        TrainingConfig(validation_fraction=0.5, test_fraction=0.5)
    assert TrainingConfig().test_fraction == 0.1 and PARAMETERS["test_fraction"]["maximum"] == 0.5


def test_the_fields_type_checkers_see_are_the_declared_params_in_order_with_their_types():
    """TrainingConfig's fields are made from the declarations at import; the TYPE_CHECKING copy of them (what IDEs and
    type checkers read) must name the same fields, in the same order, with the same types."""
    import ast
    import dataclasses
    import inspect

    from pgtrain.config import training

    body = next(node for node in ast.parse(inspect.getsource(training)).body
                if isinstance(node, ast.ClassDef) and node.name == "TrainingConfig").body
    block = next(node for node in body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    seen = [(node.target.id, eval(ast.unparse(node.annotation), vars(training)))  # noqa: S307
            for node in block.body if isinstance(node, ast.AnnAssign)]
    assert seen == [(field.name, field.type) for field in dataclasses.fields(training.TrainingConfig)]
