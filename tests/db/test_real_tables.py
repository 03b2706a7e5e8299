"""Real tables on a real PostgreSQL: text, varchar, char(1), enum and boolean columns, dates, NULLs and text
labels are planned into one encoding (kinds, means, vocabularies, classes), loaded as the encoding says, and scored
raw by ``predict`` and ``load_predictor`` exactly as training encoded them; what cannot be trained on is refused
before any rank starts, naming the column and what to do."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

from pgtrain.core.errors import PgtrainError, SourceError  # noqa: E402
from pgtrain.data import encoding, loader, manifest  # noqa: E402
from pgtrain.models.network import build_model, state_layout  # noqa: E402
from pgtrain.runs import record  # noqa: E402
from pgtrain.store.inference import load_predictor, predict  # noqa: E402
from pgtrain.store.model_store import commit_run  # noqa: E402
from pgtrain.store.tensors import write_staged  # noqa: E402
from tests.support import insert_mixed_rows, make_mixed_table, mixed_params, mixed_rows, planned_run  # noqa: E402


def loaded(conn: psycopg.Connection, run: record.Run) -> tuple[np.ndarray, np.ndarray]:
    """Every shard's (input rows, labels), in key order."""
    source = manifest.source_for(conn, run)
    data = [loader.load_shard(conn, source, shard, run.input_dim, run.config.validation_fraction, run.config.seed,
                              test_fraction=run.config.test_fraction)
            for shard in record.get_manifest(conn, run.run_id)]
    return np.concatenate([d.features for d in data]), np.concatenate([d.labels for d in data])


def commit_untrained(conn: psycopg.Connection, run: record.Run) -> torch.nn.Module:
    """Commit the run's model as built (random weights, the encoding's statistics): a version to score with."""
    config = run.config
    model = build_model(config.model, run.input_dim, run.output_dim, config.model_options_for_build, config.seed,
                        run.encoding)
    record.set_model_layout(conn, run.run_id, state_layout(model))
    write_staged(conn, run.run_id, {n: t.numpy() for n, t in model.state_dict().items()})
    record.record_epoch(conn, run.run_id, 1, {"train_loss": 0.1, "val_loss": 0.1, "val_accuracy": 0.5, "seconds": 0.1})
    record.set_status(conn, run.run_id, "trained")
    commit_run(conn, run.run_id, owner={"task_id": "test"})
    return model.eval()


def rows_of(conn: psycopg.Connection, query: str) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query).fetchall()


def test_every_column_of_a_real_table_is_planned_by_its_catalog_type(ac):
    make_mixed_table(ac, 300)
    run = planned_run(ac, world_size=2, exclude_columns=["seen"], **mixed_params())
    columns = {c["name"]: c for c in run.encoding["columns"]}
    assert list(columns) == ["island", "sex", "colour", "cut", "flagged", "body_mass", "bill"]  # table order
    assert {n: c["kind"] for n, c in columns.items()} == {
        "island": "category", "sex": "category", "colour": "category", "cut": "category", "flagged": "number",
        "body_mass": "number", "bill": "number"}
    assert columns["body_mass"]["missing"] and not columns["bill"]["missing"]  # only body_mass has NULLs
    body_mass = ac.execute("SELECT avg(body_mass) FROM public.penguins").fetchone()[0]
    assert columns["body_mass"]["mean"] == pytest.approx(body_mass, rel=1e-9)
    assert sorted(columns["island"]["levels"]) == ["Biscoe", "Dream", "Torgersen"]
    assert sorted(columns["cut"]["levels"]) == ["Fair", "Good", "Ideal", "Premium", "Very Good"]
    assert run.encoding["classes"] == ["Adelie", "Chinstrap", "Gentoo"] and run.num_classes == 3
    # 3 numbers + 1 "was missing" + 4 category codes; the model one-hot encodes 4 + 3 levels (+ other, NULL each)
    layout = encoding.layout(encoding.columns_of(run.encoding))
    assert (run.input_dim, layout.numeric, layout.sizes) == (8, 4, (5, 4, 6, 7))


def test_the_loader_encodes_each_row_as_the_python_encoder_does(ac, small_batches):
    make_mixed_table(ac, 400)
    run = planned_run(ac, world_size=3, launcher="kubernetes", **mixed_params())  # 3 ranks on a 2-CPU machine
    features, labels = loaded(ac, run)
    raw = rows_of(ac, "SELECT * FROM public.penguins ORDER BY id")
    expected = encoding.input_rows(encoding.columns_of(run.encoding), raw)
    np.testing.assert_allclose(features, expected, rtol=1e-6)  # server-side encoding == the recorded encoding
    classes = run.encoding["classes"]
    assert [classes[i] for i in labels] == [r["species"] for r in raw]
    island = [c for c in run.encoding["columns"] if c["name"] == "island"][0]
    codes = features[:, -4]  # the first category code (island)
    assert {int(c) for c, r in zip(codes, raw, strict=True) if r["island"] is None} == {encoding.NULL_LEVEL}
    assert {island["levels"][int(c) - 2] for c, r in zip(codes, raw, strict=True) if r["island"]} == set(
        island["levels"])


def test_rare_levels_are_other_and_a_cap_is_a_warning(ac):
    ac.execute("CREATE TABLE t (id integer PRIMARY KEY, city text, x real, label boolean)")
    ac.execute("""INSERT INTO t SELECT g, CASE WHEN g % 10 < 6 THEN 'common' WHEN g % 10 < 9 THEN 'middle'
                                               ELSE 'rare' || (g % 7) END, g, g % 3 = 0
                  FROM generate_series(1, 700) g""")
    run = record.plan_run(ac, "test", "r", __import__("pgtrain").config.params.TrainingConfig.from_mapping(
        {"source_table": "public.t", "feature_columns": "*", "max_categories": 2, "min_category_count": 11,
         "validation_fraction": 0, "allow_unvalidated": True}))
    plan = manifest.plan_shards(ac, run)
    run = record.get_run(ac, run.run_id)
    (city,) = [c for c in run.encoding["columns"] if c["name"] == "city"]
    assert city["levels"] == ["common", "middle"]
    assert any("'city': 9 levels; kept the 2 most frequent" in w for w in plan.warnings), plan.warnings
    assert run.encoding["classes"] == ["false", "true"]  # a boolean label: classes false, true
    features, labels = loaded(ac, run)
    codes = features[:, -1]
    assert set(codes[[i for i in range(700) if (i + 1) % 10 == 9]]) == {encoding.OTHER}
    np.testing.assert_array_equal(labels, [(g % 3 == 0) for g in range(1, 701)])


def test_integer_labels_are_classes_unless_they_are_already_0_to_k(ac):
    ac.execute("CREATE TABLE t (id integer PRIMARY KEY, x real, label integer)")
    ac.execute("INSERT INTO t SELECT g, g, CASE WHEN g % 2 = 0 THEN -1 ELSE 1 END FROM generate_series(1, 50) g")
    run = planned_run(ac, "a", source_table="public.t", feature_columns=["x"])
    assert run.encoding["classes"] == ["-1", "1"] and run.num_classes == 2
    np.testing.assert_array_equal(loaded(ac, run)[1], [g % 2 for g in range(1, 51)])  # -1 -> 0, 1 -> 1
    ac.execute("UPDATE t SET label = id % 3")
    run = planned_run(ac, "b", source_table="public.t", feature_columns=["x"])
    assert run.encoding["classes"] is None and run.num_classes == 3  # class numbers, as before class lists


def test_a_class_only_validation_rows_have_is_reported_and_coded_unseen(ac):
    from pgtrain.data.source.resolve import resolve_source
    from pgtrain.data.source.rows import is_validation

    ac.execute("CREATE TABLE t (id integer PRIMARY KEY, x real, label text)")
    ac.execute("INSERT INTO t SELECT g, g, CASE WHEN g % 2 = 0 THEN 'even' ELSE 'odd' END "
               "FROM generate_series(1, 400) g")
    source = resolve_source(ac, "public.t", "id", None, "label", feature_columns=("x",))
    (held,) = ac.execute(sql.SQL("SELECT min(id) FROM t WHERE {}").format(is_validation(source, 0.1, 0))).fetchone()
    ac.execute("UPDATE t SET label = 'unicorn' WHERE id = %s", (held,))
    run = record.plan_run(ac, "test", "r", __import__("pgtrain").config.params.TrainingConfig.from_mapping(
        {"source_table": "public.t", "feature_columns": ["x"]}))
    plan = manifest.plan_shards(ac, run)
    assert any("1 classes appear only in held-out (validation or test) rows (1 rows, e.g. 'unicorn')" in w
               for w in plan.warnings)
    run = record.get_run(ac, run.run_id)
    assert run.encoding["classes"] == ["even", "odd"]
    assert (loaded(ac, run)[1] == encoding.UNSEEN_CLASS).sum() == 1


@pytest.mark.parametrize(("setup", "params", "message"), [
    ("ALTER TABLE public.penguins ADD COLUMN extra jsonb DEFAULT '{}'", {},
     r"feature column 'extra' has type jsonb, .* exclude_columns: \['extra'\]"),
    ("ALTER TABLE public.penguins ADD COLUMN empty real", {},
     r"feature column 'empty' of public\.penguins is NULL in all 300 rows .* exclude_columns: \['empty'\]"),
    ("ALTER TABLE public.penguins ADD COLUMN nothing text", {},
     r"feature column 'nothing' of public\.penguins is NULL in all \d+ rows"),
    ("UPDATE public.penguins SET species = 'Adelie'", {},
     r"label_column 'species' of public\.penguins has 1 class in its training rows \('Adelie'\)"),
    ("ALTER TABLE public.penguins ADD COLUMN name text; UPDATE public.penguins SET name = 'n' || id", {},
     r"feature column 'name' .* has 300 distinct values in the 300 rows that have one: it identifies rows .* "
     r"exclude_columns: \['name'\]"),
    ("", {"categorical_columns": ["nope"]}, r"categorical_columns 'nope' is not a column"),
    ("", {"exclude_columns": ["species"], "feature_columns": ["island", "species"]}, r"also in feature_columns"),
])
def test_what_cannot_be_trained_on_is_refused_before_any_rank_starts(ac, setup, params, message):
    make_mixed_table(ac, 300)
    if setup:
        ac.execute(setup)
    with pytest.raises(SourceError, match=message):
        planned_run(ac, **mixed_params(**params))
    assert ac.execute("SELECT count(*) FROM pgtrain.shard_manifest").fetchone()[0] == 0


def test_a_200000_level_text_column_and_more_classes_than_allowed_are_refused(ac):
    ac.execute("CREATE TABLE t (id integer PRIMARY KEY, code text, x real, label text)")
    ac.execute("INSERT INTO t SELECT g, 'c' || g, g, 'k' || (g % 100001) FROM generate_series(1, 200000) g")
    with pytest.raises(SourceError, match=r"'code' of public\.t has 200,000 distinct values .* exclude_columns"):
        planned_run(ac, "a", source_table="public.t", feature_columns="*", label_column="label",
                    validation_fraction=0, allow_unvalidated=True)
    with pytest.raises(SourceError, match=r"label_column 'label' of public\.t has more than 100,000 distinct values"):
        planned_run(ac, "b", source_table="public.t", feature_columns=["x"], validation_fraction=0,
                    allow_unvalidated=True)


def test_predict_scores_the_raw_table_and_writes_the_labels_type(ac, db_url):
    make_mixed_table(ac, 300)
    run = planned_run(ac, **mixed_params())
    model = commit_untrained(ac, run)
    # After the version: an unseen island, a NULL in a column that had none (bill is NOT NULL in training: drop
    # that), a NULL colour, and a row added later.
    ac.execute("ALTER TABLE public.penguins ALTER COLUMN bill DROP NOT NULL")
    insert_mixed_rows(ac, mixed_rows(3, seed=9, first_id=1001))
    ac.execute("UPDATE public.penguins SET island = 'Atlantis', bill = NULL, colour = NULL WHERE id = 1001")
    done = predict(ac, "penguins", "head", "public.penguins", "id", "public.scored", probabilities=True)
    assert (done.rows, done.skipped) == (303, 0)
    kinds = ac.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                       "'public.scored'::regclass AND attname IN ('prediction', 'probabilities') ORDER BY attnum"
                       ).fetchall()
    assert kinds == [("text",), ("double precision[]",)]
    scored = rows_of(ac, "SELECT * FROM public.scored ORDER BY id")
    raw = rows_of(ac, "SELECT * FROM public.penguins ORDER BY id")
    predictor = load_predictor(db_url, "penguins")
    assert [r["prediction"] for r in scored] == predictor.predict(raw)
    np.testing.assert_allclose([r["probabilities"] for r in scored], predictor.predict_proba(raw), rtol=1e-5)
    with torch.no_grad():  # the predictor feeds the module the recorded encoding of the rows
        out = model(torch.from_numpy(encoding.input_rows(encoding.columns_of(run.encoding), raw)))
    assert [run.encoding["classes"][i] for i in out.argmax(1).tolist()] == predictor.predict(raw)
    unseen = predictor.inputs([raw[-3]])[0]
    assert unseen[-4] == encoding.OTHER and unseen[-2] == encoding.NULL_LEVEL  # island other, colour NULL
    bill = [c["mean"] for c in run.encoding["columns"] if c["name"] == "bill"][0]
    assert unseen[2] == pytest.approx(bill)  # imputed with the training mean, though bill never was NULL


def test_an_enum_or_boolean_label_is_predicted_in_its_own_type(ac, db_url):
    ac.execute("CREATE TYPE public.grade AS ENUM ('low', 'high')")
    ac.execute("CREATE TABLE t (id integer PRIMARY KEY, x real, g public.grade, ok boolean)")
    ac.execute("INSERT INTO t SELECT i, i, CASE WHEN i % 2 = 0 THEN 'low' ELSE 'high' END::public.grade, i % 3 = 0 "
               "FROM generate_series(1, 60) i")
    for label, model_name in (("g", "by-grade"), ("ok", "by-ok")):
        run = planned_run(ac, model_name, source_table="public.t", feature_columns=["x"], label_column=label,
                          model_name=model_name)
        commit_untrained(ac, run)
        predict(ac, model_name, "head", "public.t", "id", f"public.{label}_scored")
        (kind,) = ac.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                             "%s::regclass AND attname = 'prediction'", (f"public.{label}_scored",)).fetchone()
        assert kind == ("grade" if label == "g" else "boolean")
        values = [v for (v,) in ac.execute(sql.SQL("SELECT prediction::text FROM {} ORDER BY id").format(
            sql.Identifier("public", f"{label}_scored")))]
        predicted = load_predictor(db_url, model_name).predict(rows_of(ac, "SELECT * FROM t ORDER BY id"))
        assert values == [str(v).lower() for v in predicted]
        assert all(isinstance(v, bool if label == "ok" else str) for v in predicted)


def test_a_warm_start_keeps_its_versions_vocabularies_and_refuses_new_classes(ac):
    make_mixed_table(ac, 300)
    first = planned_run(ac, "first", **mixed_params())
    commit_untrained(ac, first)
    insert_mixed_rows(ac, mixed_rows(50, seed=5, first_id=2001))
    ac.execute("UPDATE public.penguins SET island = 'Atlantis' WHERE id > 2000")
    second = planned_run(ac, "second", init_from="head", **mixed_params())
    assert second.encoding["columns"] == first.encoding["columns"]  # 'Atlantis' is "other" for this model
    assert second.encoding["parent_version"] == 1
    ac.execute("UPDATE public.penguins SET species = 'Emperor' WHERE id > 2000")
    with pytest.raises(SourceError, match=r"init_from: the training rows have classes .* \('Emperor'\)"):
        planned_run(ac, "third", init_from="head", **mixed_params())


def test_the_vocabulary_scan_runs_beside_the_check_and_gives_the_same_encoding_on_one_connection(
        ac, db_url, caplog):
    import logging
    import uuid

    make_mixed_table(ac, 300)
    beside = planned_run(ac, "beside", **mixed_params())
    role = f"pgtrain_one_connection_{uuid.uuid4().hex[:8]}"
    ac.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 1").format(sql.Identifier(role)))
    try:
        ac.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA pgtrain TO {r}; GRANT SELECT ON public.penguins TO {r}; "
                           "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgtrain TO {r}"
                           ).format(r=sql.Identifier(role)))
        with psycopg.connect(db_url, user=role, autocommit=True) as limited, caplog.at_level(logging.WARNING):
            alone = planned_run(limited, "alone", **mixed_params())
        assert "planning on one connection: a second one could not be opened" in caplog.text
    finally:
        ac.execute(sql.SQL("DROP OWNED BY {r}; DROP ROLE {r}").format(r=sql.Identifier(role)))
    assert alone.encoding == beside.encoding


def test_with_bad_rows_excluded_the_vocabularies_leave_them_out(ac):
    make_mixed_table(ac, 300)
    ac.execute("UPDATE public.penguins SET island = 'Atlantis', bill = 'NaN' WHERE id <= 40")
    run = planned_run(ac, bad_rows="exclude", **mixed_params())
    (island,) = [c for c in run.encoding["columns"] if c["name"] == "island"]
    assert "Atlantis" not in island["levels"] and len(island["levels"]) == 3  # counted once, without bad rows


@pytest.mark.parametrize("recorded", ["text); DROP TABLE public.penguins; --", "nosuchtype", "text(1) x"])
def test_a_label_type_that_is_no_type_of_the_database_never_reaches_sql(ac, recorded):
    make_mixed_table(ac, 60)
    commit_untrained(ac, planned_run(ac, **mixed_params()))
    ac.execute("UPDATE pgtrain.model_versions SET spec = jsonb_set(spec, '{encoding,label_sql_type}', "
               "to_jsonb(%s::text))", (recorded,))
    with pytest.raises(PgtrainError, match="is not a type of this database"):
        predict(ac, "penguins", "head", "public.penguins", "id", "public.scored")
    assert ac.execute("SELECT to_regclass('public.scored'), to_regclass('public.penguins') IS NOT NULL").fetchone() == (
        None, True)
