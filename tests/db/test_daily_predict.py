"""predict as a nightly job on a real PostgreSQL: re-runs by mode (upsert, replace, append), atomic (a failure
leaves the previous scores), the probabilities' classes recorded, every table misfit refused before a row is
written, and load_predictor's errors naming the row and column."""

from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

torch = pytest.importorskip("torch")

from pgtrain.core.database_url import DATABASE_URL_ENV  # noqa: E402
from pgtrain.core.errors import PgtrainError, SourceError  # noqa: E402
from pgtrain.store import inference  # noqa: E402
from pgtrain.store.inference import load_predictor, predict  # noqa: E402
from tests.db.test_inference import commit_random_model  # noqa: E402
from tests.db.test_real_tables import commit_untrained  # noqa: E402
from tests.support import make_mixed_table, mixed_params, planned_run  # noqa: E402

ROWS = 50


def regression_table(conn: psycopg.Connection, rows: int = ROWS) -> torch.nn.Module:
    """A regression version of 3 inputs and public.items (id bigint key, features real[]) of ``rows`` rows."""
    model = commit_random_model(conn, "reg", 3, 1, hidden_sizes=(4,), task="regression")
    conn.execute("CREATE TABLE public.items (id bigint PRIMARY KEY, features real[])")
    conn.execute("INSERT INTO public.items SELECT i, ARRAY[i / 10.0, -i / 20.0, 1]::real[] "
                 "FROM generate_series(1, %s) AS i", (rows,))
    return model


def scores(conn: psycopg.Connection, table: str = "scores") -> list[tuple]:
    return conn.execute(sql.SQL("SELECT * FROM {} ORDER BY 1, 2").format(sql.Identifier(table))).fetchall()


def expected(conn: psycopg.Connection, model: torch.nn.Module) -> dict[int, float]:
    keys, x = zip(*conn.execute("SELECT id, features FROM public.items ORDER BY id"), strict=True)
    with torch.no_grad():
        out = model(torch.tensor(np.array(x, np.float32)))[:, 0].tolist()
    return dict(zip(keys, out, strict=True))


def test_append_refuses_a_rerun_instead_of_duplicating_every_key(aconn):
    """The red-team case: a table without a primary key got every key twice on a re-run."""
    regression_table(aconn)
    aconn.execute("CREATE TABLE public.scores (id bigint, prediction double precision)")  # no key
    assert predict(aconn, "reg", None, "items", "id", "scores", mode="append").rows == ROWS
    before = scores(aconn)

    with pytest.raises(PgtrainError, match=rf"already holds predictions for {ROWS} keys of public.items "
                                           r"\(e.g. 1, 2, .*--mode upsert updates them, --mode replace"):
        predict(aconn, "reg", None, "items", "id", "scores", mode="append")
    with pytest.raises(PgtrainError, match=r"--mode upsert matches rows by their key, but 'id' of 'scores' has no "
                                           r"unique index: ALTER TABLE \"scores\" ADD PRIMARY KEY \(\"id\"\)"):
        predict(aconn, "reg", None, "items", "id", "scores")  # the default, upsert
    assert scores(aconn) == before and len(before) == ROWS
    aconn.execute("INSERT INTO public.items VALUES (1000, '{1,2,3}')")
    with pytest.raises(PgtrainError, match="already holds predictions for 50 keys"):  # 1 new, 50 there
        predict(aconn, "reg", None, "items", "id", "scores", mode="append")
    with pytest.raises(PgtrainError, match="mode 'overwrite': give one of upsert, replace, append"):
        predict(aconn, "reg", None, "items", "id", "scores", mode="overwrite")


def test_replace_twice_gives_exactly_the_sources_rows_and_readers_never_see_an_empty_table(
        aconn, db_url, monkeypatch):
    model = regression_table(aconn)
    assert predict(aconn, "reg", None, "items", "id", "scores", mode="replace").rows == ROWS
    aconn.execute("DELETE FROM public.items WHERE id > 40")
    aconn.execute("UPDATE public.items SET features = '{9,9,9}' WHERE id = 3")
    seen = []
    write_page = inference.page_rows

    def page_and_look(*args, **kwargs):  # another session, while this run has deleted and is writing
        with psycopg.connect(db_url, autocommit=True) as reader:
            seen.append(reader.execute("SELECT count(*), count(DISTINCT id) FROM scores").fetchone())
        return write_page(*args, **kwargs)

    monkeypatch.setattr(inference, "page_rows", page_and_look)
    assert predict(aconn, "reg", None, "items", "id", "scores", batch_rows=15, mode="replace").rows == 40

    assert seen == [(ROWS, ROWS)] * 3, "readers see the previous rows until the run commits"
    got = dict(aconn.execute("SELECT id, prediction FROM scores").fetchall())
    want = expected(aconn, model)
    assert sorted(got) == list(range(1, 41))
    np.testing.assert_allclose([got[k] for k in sorted(got)], [want[k] for k in sorted(got)], atol=1e-5)


def test_upsert_updates_changed_scores_and_inserts_new_keys(aconn, db_url, capsys, monkeypatch):
    model = regression_table(aconn)
    monkeypatch.setenv(DATABASE_URL_ENV, db_url)
    from pgtrain.cli.models import main

    command = ["predict", "--model", "reg", "--source", "items", "--key-column", "id", "--into", "scores",
               "--batch-rows", "16"]
    assert main(command) == 0
    first = dict(aconn.execute("SELECT id, prediction FROM scores").fetchall())
    aconn.execute("UPDATE public.items SET features = ARRAY[5, 5, id]::real[] WHERE id IN (2, 30)")
    aconn.execute("INSERT INTO public.items VALUES (51, '{1,1,1}'), (52, '{2,2,2}')")
    aconn.execute("DELETE FROM public.items WHERE id = 7")

    assert main([*command, "--mode", "upsert"]) == 0

    assert "wrote 51 predictions of reg version 1 into scores; mode upsert" in capsys.readouterr().out
    got = dict(aconn.execute("SELECT id, prediction FROM scores").fetchall())
    want = expected(aconn, model)
    assert sorted(got) == list(range(1, 53)), "one row a key; a key gone from the source keeps its last score"
    assert got[7] == first[7]
    for key in (2, 30, 51, 52, 1, 50):
        assert got[key] == pytest.approx(want[key], abs=1e-5), key
    assert got[2] != pytest.approx(first[2], abs=1e-5) and got[30] != pytest.approx(first[30], abs=1e-5)


@pytest.mark.parametrize("mode", ["upsert", "replace", "append"])
def test_a_table_predict_creates_takes_one_copy_in_every_mode_and_one_that_was_there_its_mode(aconn, mode):
    """A new table has no rows and no other session sees it before the run commits: no staging, no key check,
    no delete. A table that was there is written as its mode says."""
    from pgtrain.store import prediction_table

    model = regression_table(aconn)
    targets = []
    open_target = prediction_table.open_target

    def open_and_note(*args, **kwargs):
        targets.append(target := open_target(*args, **kwargs))
        return target

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inference, "open_target", open_and_note)
        assert predict(aconn, "reg", None, "items", "id", "scores", mode=mode).rows == ROWS
        aconn.execute("UPDATE public.items SET features = '{7,7,7}' WHERE id = 5")
        if mode == "append":  # which refuses keys already there
            aconn.execute("DELETE FROM scores")
        assert predict(aconn, "reg", None, "items", "id", "scores", mode=mode).rows == ROWS

    created, there = targets
    assert created.copy_into == created.table
    assert (there.copy_into == there.table) == (mode != "upsert")  # only an upsert stages its rows
    got = dict(aconn.execute("SELECT id, prediction FROM scores").fetchall())
    want = expected(aconn, model)
    assert sorted(got) == list(range(1, ROWS + 1))
    np.testing.assert_allclose([got[k] for k in sorted(got)], [want[k] for k in sorted(got)], atol=1e-5)


@pytest.mark.parametrize("mode", ["upsert", "replace"])
def test_into_names_the_table_sql_resolves_to_and_predict_writes_it_in_its_mode(aconn, mode):
    """A session's temporary table hides a table of the same name: predict writes the one the name resolves to
    (and creates no other), in its mode: it is not a table predict created."""
    model = regression_table(aconn)
    aconn.execute("CREATE TEMPORARY TABLE scores (id bigint PRIMARY KEY, prediction double precision NOT NULL)")
    aconn.execute("INSERT INTO scores VALUES (1, -1), (999, -1)")

    assert predict(aconn, "reg", None, "items", "id", "scores", mode=mode).rows == ROWS

    assert aconn.execute("SELECT to_regclass('public.scores')").fetchone()[0] is None
    got = dict(aconn.execute("SELECT id, prediction FROM pg_temp.scores").fetchall())
    assert sorted(got) == list(range(1, ROWS + 1)) + ([999] if mode == "upsert" else [])
    assert got[1] == pytest.approx(expected(aconn, model)[1], abs=1e-5)


@pytest.mark.parametrize("mode", ["upsert", "replace", "append"])
@pytest.mark.parametrize("failure", ["bad_source_row", "table_refuses_a_row"])
def test_a_failure_midway_leaves_the_previous_scores(aconn, mode, failure):
    regression_table(aconn)
    predict(aconn, "reg", None, "items", "id", "scores", mode="replace")
    aconn.execute("UPDATE public.items SET features = '{7,7,7}' WHERE id <= 10")  # would change these scores
    if mode == "append":  # new keys only, as append needs
        aconn.execute("DELETE FROM scores WHERE id > 30")
        aconn.execute("DELETE FROM public.items WHERE id <= 30")
    before = scores(aconn)
    if failure == "bad_source_row":
        aconn.execute("UPDATE public.items SET features = '{1,NaN,1}' WHERE id = 45")  # on a later page
        error, message = SourceError, r"1 rows of public.items \(of \d+\) cannot be scored"
    else:
        aconn.execute("ALTER TABLE scores ADD CONSTRAINT below_45 CHECK (id < 45) NOT VALID")
        error, message = PgtrainError, (r"table 'scores' refused a prediction: new row for relation \"scores\" "
                                        r"violates check constraint \"below_45\".*the table keeps its previous rows")

    with pytest.raises(error, match=message):
        predict(aconn, "reg", None, "items", "id", "scores", batch_rows=5, mode=mode)

    assert scores(aconn) == before
    assert aconn.execute("SELECT to_regclass('pg_temp.pgtrain_predictions_staged')").fetchone() == (None,)


def test_the_probabilities_classes_are_recorded_in_the_columns_comment(ac, db_url):
    from pgtrain.store.prediction_table import probability_classes

    make_mixed_table(ac, 120)
    run = planned_run(ac, **mixed_params())
    commit_untrained(ac, run)
    predict(ac, "penguins", "head", "public.penguins", "id", "public.scored", probabilities=True)

    classes = ["Adelie", "Chinstrap", "Gentoo"]
    assert run.encoding["classes"] == classes
    assert probability_classes(ac, "public.scored") == classes
    (in_sql,) = ac.execute("SELECT col_description(attrelid, attnum)::jsonb -> 'classes' FROM pg_attribute "
                           "WHERE attrelid = 'public.scored'::regclass AND attname = 'probabilities'").fetchone()
    assert in_sql == classes
    with ac.cursor(row_factory=dict_row) as cur:
        rows = cur.execute("SELECT * FROM public.penguins ORDER BY id").fetchall()
        scored = cur.execute("SELECT * FROM public.scored ORDER BY id").fetchall()
    by_name = [dict(zip(classes, r["probabilities"], strict=True)) for r in scored]
    assert [max(p, key=p.get) for p in by_name] == [r["prediction"] for r in scored]
    np.testing.assert_allclose([r["probabilities"] for r in scored],
                               load_predictor(db_url, "penguins").predict_proba(rows), rtol=1e-5)

    # Rows of other classes never stay beside this version's: refused, unless replaced.
    ac.execute("""COMMENT ON COLUMN public.scored.probabilities IS '{"classes": ["a", "b", "c"]}'""")
    with pytest.raises(PgtrainError, match=r"holds probabilities of the classes \['a', 'b', 'c'\]; this version's "
                                           r"are \['Adelie', 'Chinstrap', 'Gentoo'\]: --mode replace"):
        predict(ac, "penguins", "head", "public.penguins", "id", "public.scored", probabilities=True)
    predict(ac, "penguins", "head", "public.penguins", "id", "public.scored", probabilities=True, mode="replace")
    assert probability_classes(ac, "public.scored") == classes

    commit_random_model(ac, "clf", 3, 2, hidden_sizes=(4,))  # class numbers: their text form
    ac.execute("CREATE TABLE public.arrays (id integer PRIMARY KEY, features real[])")
    ac.execute("INSERT INTO public.arrays VALUES (1, '{1,2,3}')")
    predict(ac, "clf", None, "arrays", "id", "numbered", probabilities=True)
    assert probability_classes(ac, "numbered") == ["0", "1"]
    assert probability_classes(ac, "public.penguins") is None


def test_every_misfit_of_the_table_is_refused_before_a_row_is_written(ac):
    make_mixed_table(ac, 60)
    commit_untrained(ac, planned_run(ac, **mixed_params()))
    predict(ac, "penguins", "head", "public.penguins", "id", "public.scored", probabilities=True)
    with_probabilities = scores(ac, "scored")

    with pytest.raises(PgtrainError, match=r"table 'public.scored' does not fit what predict writes: it has a "
                                           r"'probabilities' column .* pass --probabilities"):
        predict(ac, "penguins", "head", "public.penguins", "id", "public.scored")  # NotNullViolation before

    ac.execute("CREATE TABLE public.noted (id integer PRIMARY KEY, prediction text, note text NOT NULL)")
    with pytest.raises(PgtrainError, match=r"its column 'note' is NOT NULL without a default, and predict writes "
                                           r"only id, prediction: drop the constraint or give it a default"):
        predict(ac, "penguins", "head", "public.penguins", "id", "public.noted")

    ac.execute("CREATE TABLE public.typed (id bigint PRIMARY KEY, prediction public.cut)")
    with pytest.raises(PgtrainError, match=r"its column 'id' is bigint, predict writes integer there; its column "
                                           r"'prediction' is cut, predict writes text there"):
        predict(ac, "penguins", "head", "public.penguins", "id", "public.typed")

    ac.execute("CREATE TYPE public.grade AS ENUM ('low', 'high')")
    ac.execute("CREATE TABLE t (id integer PRIMARY KEY, x real, g public.grade)")
    ac.execute("INSERT INTO t SELECT i, i, CASE WHEN i % 2 = 0 THEN 'low' ELSE 'high' END::public.grade "
               "FROM generate_series(1, 40) i")
    commit_untrained(ac, planned_run(ac, "graded", source_table="public.t", feature_columns=["x"],
                                     label_column="g", model_name="by-grade"))
    predict(ac, "by-grade", "head", "public.t", "id", "public.graded")
    graded = scores(ac, "graded")
    ac.execute("ALTER TYPE public.grade RENAME VALUE 'low' TO 'lo'")
    with pytest.raises(PgtrainError, match=r"the version's classes cannot be written as grade: invalid input value "
                                           r"for enum grade: \"low\"; the label's type changed since training"):
        predict(ac, "by-grade", "head", "public.t", "id", "public.graded", mode="replace")

    assert scores(ac, "scored") == with_probabilities and scores(ac, "graded") == graded
    assert ac.execute("SELECT count(*) FROM public.noted").fetchone() == (0,)


def test_load_predictor_names_the_row_and_column_it_cannot_read(ac, db_url):
    make_mixed_table(ac, 60)
    commit_untrained(ac, planned_run(ac, **mixed_params()))
    with ac.cursor(row_factory=dict_row) as cur:
        rows = cur.execute("SELECT * FROM public.penguins ORDER BY id LIMIT 8").fetchall()
    rows[5]["body_mass"] = "forty"
    predictor = load_predictor(db_url, "penguins")
    with pytest.raises(SourceError, match=r"row 5 \(id 6\), column 'body_mass': 'forty' cannot be read as the "
                                          r"model's input \(could not convert string to float: 'forty'\)"):
        predictor.predict(rows)
    rows[5]["body_mass"], rows[2]["seen"] = 4100.0, "yesterday"
    with pytest.raises(SourceError, match=r"row 2 \(id 3\), column 'seen': 'yesterday'"):
        predictor.predict(rows)

    commit_random_model(ac, "plain", 2, 2, features_column=None, feature_columns=("a", "b"))
    plain = load_predictor(ac, "plain")
    with pytest.raises(SourceError, match=r"row 1 \(id 12\), column 'b': 'forty' cannot be read"):
        plain.predict([{"id": 11, "a": 1, "b": 2}, {"id": 12, "a": 1.5, "b": "forty"}])
    with pytest.raises(SourceError, match=r"row 0 has no column 'b'; the model's input columns are 'a', 'b'"):
        plain.predict([{"a": 1}])
    assert len(plain.predict([{"a": 1, "b": 2}])) == 1
    assert json.dumps(plain.feature_columns) == '["a", "b"]'
