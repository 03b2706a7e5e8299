"""What a version stores of a categorical column, on a real PostgreSQL: the DAG author bounds max_categories and
min_category_count (a trigger beyond them is refused before planning), and levels of the author's hashed columns,
of a column keeping more than max_clear_levels, or longer than max_level_length are stored as their hashes only,
which score exactly as clear levels (the loader, predict and load_predictor); the key-like rule counts every row.
"""

from __future__ import annotations

import argparse
import random
import re

import psycopg
import pytest
from psycopg import sql

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

from pgtrain.cli import models as models_cli  # noqa: E402
from pgtrain.config.params import TrainingConfig  # noqa: E402
from pgtrain.config.settings import AuthorSettings  # noqa: E402
from pgtrain.core.errors import ConfigError, SourceError  # noqa: E402
from pgtrain.data import encoding, level_storage, manifest, policy  # noqa: E402
from pgtrain.data.text_hash import hashtextextended  # noqa: E402
from pgtrain.runs import record  # noqa: E402
from pgtrain.store import model_store  # noqa: E402
from pgtrain.store.inference import load_predictor, predict  # noqa: E402
from tests.db.test_real_tables import commit_untrained, loaded, rows_of  # noqa: E402
from tests.support import planned_run  # noqa: E402

SSN = re.compile(r"\d{3}-\d{2}-\d{4}")
PEOPLE = {"source_table": "public.people", "feature_columns": ["email", "ssn", "city", "x"], "label_column": "label",
          "model_name": "people", "max_categories": 1000, "min_category_count": 1}


def make_people(conn: psycopg.Connection, rows: int = 800) -> None:
    """One row per person: a unique e-mail and SSN, a city among four, a number and a label."""
    conn.execute("CREATE TABLE public.people (id integer PRIMARY KEY, email text, ssn text, city text, x real, "
                 "label text NOT NULL)")
    conn.execute("""INSERT INTO public.people
                    SELECT g, 'person' || g || '@example.com', lpad((g * 7919 %% 1000)::text, 3, '0') || '-'
                           || lpad((g %% 100)::text, 2, '0') || '-' || lpad(g::text, 4, '0'),
                           (ARRAY['Oslo', 'Lima', 'Pune', 'Kyiv'])[g %% 4 + 1], g %% 17, CASE WHEN g %% 3 = 0 THEN 'yes'
                           ELSE 'no' END
                    FROM generate_series(1, %s) g""", (rows,))


def admitted_run(conn: psycopg.Connection, settings: AuthorSettings, dag_run_id: str = "r", **params) -> record.Run:
    """plan_run as the DAG's task does it (the author's settings admit the config), then compute_shards."""
    return planned_run(conn, dag_run_id, author=settings, **params)


def everything_stored(conn: psycopg.Connection) -> str:
    """Every row of every table of the pgtrain schema as text: what a version, its run and its tables hold."""
    tables = [t for (t,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'pgtrain'")]
    return "\n".join(text for table in tables for (text,) in conn.execute(
        sql.SQL("SELECT CAST(t AS text) FROM {} AS t").format(sql.Identifier("pgtrain", table))))


@pytest.mark.parametrize(("params", "message"), [
    ({"max_categories": 10000}, r"max_categories 10000 is more than the 500 levels per categorical column this "
                                r"DAG's author allows \(categories\.max_categories .*\): ask for at most 500"),
    ({"max_categories": 500, "min_category_count": 1},
     r"min_category_count 1 is less than the 3 training rows a kept level needs .* ask for at least 3"),
])
def test_a_trigger_beyond_the_authors_category_bounds_is_refused_before_planning(ac, params, message):
    make_people(ac)
    settings = AuthorSettings(categories={"max_categories": 500, "min_category_count": 3})
    with pytest.raises(ConfigError, match=message):
        policy.admit(ac, TrainingConfig.from_mapping({**PEOPLE, **params}), settings)
    with pytest.raises(ConfigError, match=r"more than the 1000 levels"):  # the default bound
        policy.admit(ac, TrainingConfig.from_mapping({**PEOPLE, "max_categories": 10000}), AuthorSettings())
    assert ac.execute("SELECT count(*) FROM pgtrain.training_runs").fetchone()[0] == 0


def test_the_authors_hashed_columns_are_never_stored_in_clear_and_score_as_training_encoded(ac, db_url, capsys):
    make_people(ac)
    settings = AuthorSettings(categories={"hashed_columns": ["email", "ssn"]})
    run = admitted_run(ac, settings, **PEOPLE)
    assert (run.config.hashed_columns, run.config.max_clear_levels) == (("email", "ssn"), 100)
    columns = {c.name: c for c in encoding.columns_of(run.encoding)}
    for name in ("email", "ssn"):
        assert len(columns[name].levels) > 600  # every training row's value is a level, by its hash
        assert all(level_storage.is_hashed(lv, h) for lv, h in zip(columns[name].levels, columns[name].hashes,
                                                                    strict=True))
    assert sorted(columns["city"].levels) == ["Kyiv", "Lima", "Oslo", "Pune"]  # not hashed: in clear
    commit_untrained(ac, run)

    stored = everything_stored(ac)  # spec JSON, the run's encoding and config, warnings, tensors: all of it
    assert "@example.com" not in stored and not SSN.search(stored) and "Oslo" in stored
    shown = model_store.get_version(ac, "people", 1)
    assert "@example.com" not in str(shown) and not SSN.search(str(shown))
    models_cli.cmd_show(ac, argparse.Namespace(model="people", version=None, json=False))
    text = capsys.readouterr().out
    assert re.search(r"category  email: \d+ levels stored as hashes only", text), text
    assert "category  city: 4 levels in clear" in text

    raw = rows_of(ac, "SELECT * FROM public.people ORDER BY id")
    predictor = load_predictor(db_url, "people")
    assert [c.levels for c in predictor.columns] == [c.levels for c in encoding.columns_of(run.encoding)]
    features, _ = loaded(ac, run)
    np.testing.assert_array_equal(predictor.inputs(raw), features)  # load_predictor == the loader's encoding
    email = [i for i, (_, c) in enumerate(encoding.inputs(predictor.columns)) if c.name == "email"][0]
    assert (features[:, email] >= encoding.FIRST_LEVEL).sum() > 600  # hashed levels are levels, not "other"
    predict(ac, "people", "head", "public.people", "id", "public.scored")
    scored = [p for (p,) in ac.execute("SELECT prediction FROM public.scored ORDER BY id")]
    assert scored == predictor.predict(raw)


def test_a_column_keeping_more_levels_than_the_authors_clear_cap_is_stored_hashed(ac):
    make_people(ac)
    run = admitted_run(ac, AuthorSettings(categories={"max_clear_levels": 3}), **PEOPLE)
    counts = {c.name: level_storage.described(c) for c in encoding.columns_of(run.encoding)
              if c.kind == "category"}
    assert counts["city"] == {"levels": 4, "clear": 0, "hashed": 4}
    assert counts["email"]["clear"] == 0 and "@example.com" not in str(run.encoding)


def test_a_long_level_is_stored_as_its_hash_and_still_scores(ac, db_url):
    long = "free text " * 500  # 5,000 characters
    ac.execute("CREATE TABLE t (id integer PRIMARY KEY, note text, label integer NOT NULL)")
    ac.execute("INSERT INTO t SELECT g, CASE g %% 3 WHEN 0 THEN %s WHEN 1 THEN 'short' ELSE NULL END, g %% 3 %% 2 "
               "FROM generate_series(1, 300) g", (long,))
    run = planned_run(ac, source_table="public.t", feature_columns=["note"], model_name="notes")
    (note,) = encoding.columns_of(run.encoding)
    assert set(note.levels) == {"short", level_storage.digest(hashtextextended(long))}
    assert long not in str(run.encoding)
    commit_untrained(ac, run)
    assert long.strip() not in everything_stored(ac)
    predictor = load_predictor(db_url, "notes")
    codes = predictor.inputs([{"note": long}, {"note": "short"}, {"note": None}, {"note": "new"}])[:, 0]
    code_of = {level: encoding.FIRST_LEVEL + i for i, level in enumerate(note.levels)}
    assert codes.tolist() == [code_of[level_storage.digest(hashtextextended(long))], code_of["short"],
                              encoding.NULL_LEVEL, encoding.OTHER]
    np.testing.assert_array_equal(predictor.inputs(rows_of(ac, "SELECT * FROM t ORDER BY id")), loaded(ac, run)[0])


def test_the_python_text_hash_is_postgresqls(ac):
    rng = random.Random(7)
    texts = ["", "a", "abcd", "abcdefgh", "abcdefghijk", "abcdefghijkl", "é", "Ünïcødé 😀", "x" * 5000] + [
        "".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(0, 40))) for _ in range(300)]
    found = [h for (h,) in ac.execute('SELECT hashtextextended(t COLLATE "C", 0) FROM unnest(%s::text[]) '
                                      "WITH ORDINALITY AS u(t, i) ORDER BY i", (texts,))]
    assert found == [hashtextextended(t) for t in texts]


def test_a_2000_level_zip_column_in_6000_rows_plans_with_rare_levels_as_other(ac):
    # 2,000 zip codes: 50 common ones (over 40 rows each), the other 1,950 in 2 rows each.
    ac.execute("CREATE TABLE t (id integer PRIMARY KEY, zip integer NOT NULL, x real, label boolean NOT NULL)")
    ac.execute("INSERT INTO t SELECT g, 10000 + CASE WHEN g <= 4000 THEN g % 2000 ELSE g % 50 END, g % 11, g % 2 = 0 "
               "FROM generate_series(1, 6000) g")
    run = record.plan_run(ac, "test", "zip", TrainingConfig.from_mapping(
        {"source_table": "public.t", "feature_columns": ["zip", "x"], "categorical_columns": ["zip"]}))
    plan = manifest.plan_shards(ac, run)
    run = record.get_run(ac, run.run_id)
    (zip_column,) = [c for c in encoding.columns_of(run.encoding) if c.name == "zip"]
    assert sorted(map(int, zip_column.levels)) == list(range(10000, 10050))  # the common ones, in clear
    assert any("'zip': 2,000 levels; kept the 50 most frequent" in w for w in plan.warnings), plan.warnings
    features, _ = loaded(ac, run)
    rare = ac.execute("SELECT count(*) FROM t WHERE zip >= 10050").fetchone()[0]
    assert (features[:, -1] == encoding.OTHER).sum() == rare == 3900


def test_a_true_key_column_is_refused_with_the_right_counts(ac):
    ac.execute("CREATE TABLE t (id integer PRIMARY KEY, code text, x real, label boolean NOT NULL)")
    ac.execute("INSERT INTO t SELECT g, CASE WHEN g % 10 = 0 THEN NULL ELSE 'c' || g END, g, g % 2 = 0 "
               "FROM generate_series(1, 6000) g")
    with pytest.raises(SourceError, match=r"feature column 'code' of public\.t has 5,400 distinct values in the 5,400 "
                                          r"rows that have one: it identifies rows .* exclude_columns: \['code'\]"):
        planned_run(ac, source_table="public.t", feature_columns=["code", "x"])


@pytest.mark.parametrize(("params", "settings", "message"), [
    ({"label_column": "email"}, AuthorSettings(categories={"hashed_columns": ["email"]}),
     r"label_column 'email' is one of the hashed_columns"),
    ({"label_column": "ssn"}, AuthorSettings(),
     r"label_column 'ssn' has \d{3} classes, more than the 100 levels a version may store in clear"),
    ({"label_column": "email"}, AuthorSettings(categories={"max_clear_levels": 1000, "max_level_length": 16}),
     r"label_column 'email' has \d+ classes longer than 16 characters"),
])
def test_a_label_a_triggerer_picks_is_not_stored_in_clear_beyond_the_authors_rules(ac, params, settings, message):
    """Classes are stored in clear (predict writes the label in its own type): a triggerer choosing a private or
    key-like column as the label is refused while planning, before any rank starts, and nothing of it is stored."""
    make_people(ac)
    entry = {**PEOPLE, "feature_columns": ["city", "x"], **params}
    with pytest.raises(SourceError, match=message):
        admitted_run(ac, settings, **entry)
    assert "@example.com" not in everything_stored(ac) and not SSN.search(everything_stored(ac))
    assert admitted_run(ac, settings, "fine", **PEOPLE).encoding["classes"] == ["no", "yes"]  # a real label plans
