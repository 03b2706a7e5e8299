"""load_model and predict on a real PostgreSQL: a committed version scores a table like the module itself."""

from __future__ import annotations

import traceback

import numpy as np
import psycopg
import pytest

torch = pytest.importorskip("torch")

from psycopg.types.json import Jsonb  # noqa: E402

import pgtrain  # noqa: E402
from pgtrain.config.params import TrainingConfig  # noqa: E402
from pgtrain.core.database_url import DATABASE_URL_ENV  # noqa: E402
from pgtrain.core.errors import ConfigError, PgtrainError, SourceError  # noqa: E402
from pgtrain.models.network import build_model, state_layout  # noqa: E402
from pgtrain.runs.record import plan_run, record_epoch, set_model_layout  # noqa: E402
from pgtrain.store.inference import predict  # noqa: E402
from pgtrain.store.model_store import commit_run  # noqa: E402
from pgtrain.store.tensors import write_staged  # noqa: E402


def commit_random_model(conn: psycopg.Connection, name: str, input_dim: int, output_dim: int,
                        old_options: dict | None = None, **config) -> torch.nn.Module:
    """A version of a model built by pgtrain.models.network.build_model with random weights and statistics; with
    ``old_options``, a version of an older pgtrain: built with them and its spec recording them."""
    config = TrainingConfig(model_name=name, **config)
    model = build_model("mlp", input_dim, output_dim, old_options or config.model_options_for_build, seed=3)
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.copy_(torch.rand(tensor.shape, generator=generator) + 0.5)
        if "target.low" in model.state_dict():  # a range wide enough that the clamp leaves these tests' rows alone
            model.target.low.fill_(-1e6)
            model.target.high.fill_(1e6)
    run = plan_run(conn, "pgtrain_training", f"{name}-run", config)
    conn.execute("UPDATE pgtrain.training_runs SET input_dim = %s, output_dim = %s, status = 'trained' "
                 "WHERE run_id = %s", (input_dim, output_dim, run.run_id))
    set_model_layout(conn, run.run_id, state_layout(model))
    write_staged(conn, run.run_id, {n: t.numpy() for n, t in model.state_dict().items()})
    record_epoch(conn, run.run_id, 1, {"train_loss": 0.1, "val_loss": 0.1, "seconds": 0.1})
    commit_run(conn, run.run_id, owner={"task_id": "test"})
    if old_options is not None:
        conn.execute("UPDATE pgtrain.model_versions SET spec = jsonb_set(spec, '{model_options}', %s) "
                     "WHERE model_name = %s", (Jsonb(old_options), name))
    return model.eval()


def test_load_model_rebuilds_the_head_in_eval_mode(aconn, db_url):
    model = commit_random_model(aconn, "clf", 4, 3, hidden_sizes=(5,))

    loaded = pgtrain.load_model(db_url, "clf")  # by URL, head
    again = pgtrain.load_model(aconn, "clf", version=1)

    assert not loaded.training and not again.training
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    with pytest.raises(PgtrainError, match="has no version 9"):
        pgtrain.load_model(aconn, "clf", version=9)


@pytest.mark.parametrize("task, output_dim", [("regression", 1), ("classification", 3)])
def test_a_version_from_before_the_ensemble_loads_and_predicts_as_it_did(aconn, task, output_dim):
    """A version whose spec records the options of old (hidden_sizes, dropout, normalization: no members, no
    clamp_target) rebuilds as the plain MLP it was, without the range buffers, and scores as that module."""
    old = {"hidden_sizes": [5], "dropout": 0.0, "normalization": "none"}
    model = commit_random_model(aconn, "old", 4, output_dim, old_options=old, task=task)
    loaded = pgtrain.load_model(aconn, "old")
    predictor = pgtrain.load_predictor(aconn, "old")

    assert isinstance(loaded.net, torch.nn.Sequential) and set(loaded.state_dict()) == set(model.state_dict())
    assert "target.low" not in loaded.state_dict()
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((9, 4)).astype(np.float32)) * 100
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    rows = [{"features": row.tolist()} for row in x.numpy()]
    got = predictor.predict_proba(rows) if task == "classification" else predictor.predict(rows)
    want = torch.softmax(model(x), 1) if task == "classification" else model(x)[:, 0]
    np.testing.assert_allclose(np.asarray(got, np.float64), want.detach().numpy(), atol=1e-5, rtol=0)


def test_importing_pgtrain_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, pgtrain; print('torch' in sys.modules, callable(pgtrain.load_model))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True"], out.stderr


def test_predict_classification_from_scalar_columns_of_a_mixed_case_table(aconn, db_url, capsys, monkeypatch):
    model = commit_random_model(aconn, "clf", 3, 4, hidden_sizes=(6,), features_column=None,
                                feature_columns=("Alpha", "beta", "gamma"), label_column="y")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((53, 3))
    aconn.execute('CREATE SCHEMA "Clinic"')
    aconn.execute('CREATE TABLE "Clinic"."Biopsy Rows" (code text PRIMARY KEY, "Alpha" double precision, '
                  'beta real, gamma integer, y integer)')
    x[:, 1] = x[:, 1].astype(np.float32)
    x[:, 2] = np.round(x[:, 2] * 10)
    with aconn.cursor() as cur:
        cur.executemany('INSERT INTO "Clinic"."Biopsy Rows" VALUES (%s, %s, %s, %s, 0)',
                        [(f"k{i:03d}", *map(float, row)) for i, row in enumerate(x)])
    monkeypatch.setenv(DATABASE_URL_ENV, db_url)
    from pgtrain.cli.models import main

    assert main(["predict", "--model", "clf", "--source", '"Clinic"."Biopsy Rows"', "--key-column", "code",
                 "--into", '"Clinic"."Scores"', "--batch-rows", "10"]) == 0

    assert "wrote 53 predictions of clf version 1" in capsys.readouterr().out
    got = aconn.execute('SELECT code, prediction FROM "Clinic"."Scores" ORDER BY code').fetchall()
    want = model(torch.from_numpy(x.astype(np.float32))).argmax(dim=1).numpy()
    assert [k for k, _ in got] == [f"k{i:03d}" for i in range(53)]
    assert [p for _, p in got] == want.tolist()
    with pytest.raises(PgtrainError, match="already holds predictions"):
        predict(aconn, "clf", None, '"Clinic"."Biopsy Rows"', "code", '"Clinic"."Scores"', mode="append")


def test_predict_regression_from_an_array_column_matches_the_module(aconn):
    model = commit_random_model(aconn, "reg", 5, 2, hidden_sizes=(7,), task="regression")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((41, 5)).astype(np.float32)
    aconn.execute("CREATE TABLE public.houses (id bigint PRIMARY KEY, features real[], label real[])")
    with aconn.cursor() as cur:
        cur.executemany("INSERT INTO public.houses VALUES (%s, %s, '{0,0}')",
                        [(i * 3, row.tolist()) for i, row in enumerate(x)])

    done = predict(aconn, "reg", "head", "houses", "id", "out_houses", batch_rows=8)

    assert done.rows == 41 and done.version == 1
    got = aconn.execute("SELECT id, prediction FROM out_houses ORDER BY id").fetchall()
    assert [k for k, _ in got] == [i * 3 for i in range(41)]
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.array([p for _, p in got]), want, atol=1e-5, rtol=0)


def test_predict_names_a_recorded_feature_column_the_source_lacks(aconn):
    commit_random_model(aconn, "clf", 2, 2, features_column=None, feature_columns=("a", "b"))
    aconn.execute("CREATE TABLE public.partial (id integer PRIMARY KEY, a real)")
    aconn.execute("INSERT INTO public.partial VALUES (1, 0.5)")

    with pytest.raises(SourceError, match=r"feature_columns 'b' is not a column of public.partial.*"
                                          r"trained on the feature columns 'a', 'b'"):
        predict(aconn, "clf", None, "public.partial", "id", "scores")
    with pytest.raises(SourceError, match="does not exist"):
        predict(aconn, "clf", None, "public.nowhere", "id", "scores")
    assert aconn.execute("SELECT to_regclass('scores')").fetchone() == (None,), "nothing is written"


def test_predict_never_writes_into_pgtrains_own_schema(aconn):
    """pgtrain's schema holds the migrations' tables only: a target there, named or reached through the
    search_path, is refused before anything is created."""
    commit_random_model(aconn, "reg", 5, 2, hidden_sizes=(7,), task="regression")
    aconn.execute("CREATE TABLE public.houses (id bigint PRIMARY KEY, features real[], label real[])")
    aconn.execute("INSERT INTO public.houses VALUES (1, '{1,2,3,4,5}', '{0,0}')")
    for into in ("pgtrain.scores", '"pgtrain"."Scores"'):
        with pytest.raises(PgtrainError, match="is in pgtrain's own schema 'pgtrain'.*e.g. public.scores"):
            predict(aconn, "reg", "head", "houses", "id", into)
    aconn.execute("SET search_path TO pgtrain, public")
    with pytest.raises(PgtrainError, match="is in pgtrain's own schema"):
        predict(aconn, "reg", "head", "public.houses", "id", "scores")
    aconn.execute("RESET search_path")
    assert aconn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'pgtrain' "
                         "AND tablename ILIKE 'scores'").fetchone() == (0,)
    assert predict(aconn, "reg", "head", "houses", "id", "public.scores").rows == 1


def test_predict_refuses_a_key_without_a_unique_index(aconn):
    # Keyset pages on a key that may repeat would skip the repeats at a page boundary: refused, with the fix.
    commit_random_model(aconn, "clf", 2, 2, features_column=None, feature_columns=("a", "b"))
    aconn.execute("CREATE TABLE public.events (id integer, a real, b real)")
    aconn.execute("INSERT INTO public.events SELECT i / 2, i, -i FROM generate_series(0, 9) AS i")

    with pytest.raises(SourceError, match=r"""key_column 'id' of "public"."events" has no unique index.*"""
                                          r"""ALTER TABLE "public"."events" ADD PRIMARY KEY \("id"\)"""):
        predict(aconn, "clf", None, "public.events", "id", "scores", batch_rows=3)
    aconn.execute("CREATE VIEW public.events_view AS SELECT * FROM public.events")
    with pytest.raises(SourceError, match="is a view"):
        predict(aconn, "clf", None, "public.events_view", "id", "scores")
    assert aconn.execute("SELECT to_regclass('scores')").fetchone() == (None,), "nothing is written"

    aconn.execute("CREATE TABLE public.unique_events AS SELECT DISTINCT ON (id) * FROM public.events")
    aconn.execute("CREATE UNIQUE INDEX ON public.unique_events (id)")
    done = predict(aconn, "clf", None, "public.unique_events", "id", "scores", batch_rows=2)
    assert done.rows == 5
    assert [k for (k,) in aconn.execute("SELECT id FROM scores ORDER BY id")] == [0, 1, 2, 3, 4]


def test_predict_reports_bad_rows_or_skips_them_when_asked(aconn, db_url, capsys, monkeypatch):
    model = commit_random_model(aconn, "clf", 2, 3, hidden_sizes=(4,), features_column=None,
                                feature_columns=("a", "b"))
    aconn.execute("CREATE TABLE public.visits (id integer UNIQUE, a double precision, b real)")
    with aconn.cursor() as cur:
        cur.executemany("INSERT INTO public.visits VALUES (%s, %s, %s)",
                        [(i, i / 10, 1 - i / 10) for i in range(20)])
    aconn.execute("UPDATE public.visits SET a = NULL WHERE id IN (4, 13)")
    aconn.execute("UPDATE public.visits SET b = 'NaN' WHERE id = 7")
    aconn.execute("INSERT INTO public.visits VALUES (NULL, 0.5, 0.5)")

    with pytest.raises(SourceError) as failure:
        predict(aconn, "clf", None, "public.visits", "id", "scores", batch_rows=6)
    message = str(failure.value)
    assert "4 rows of public.visits (of 21) cannot be scored" in message, message
    assert "null_key: 1 rows (the key is NULL)" in message, message
    assert "null_features: 2 rows (a feature column is NULL), e.g. keys 4, 13" in message, message
    assert "non_finite: 1 rows (a feature column is NaN or infinite), e.g. keys 7" in message, message
    assert "--skip-bad-rows" in message
    assert aconn.execute("SELECT to_regclass('scores')").fetchone() == (None,), "nothing is written"

    monkeypatch.setenv(DATABASE_URL_ENV, db_url)
    from pgtrain.cli.models import main

    assert main(["predict", "--model", "clf", "--source", "visits", "--key-column", "id", "--into", "scores",
                 "--batch-rows", "6", "--skip-bad-rows"]) == 0
    assert "wrote 17 predictions of clf version 1 into scores (skipped 4 bad rows)" in capsys.readouterr().out
    got = aconn.execute("SELECT id, prediction FROM scores ORDER BY id").fetchall()
    good = [i for i in range(20) if i not in (4, 7, 13)]
    assert [k for k, _ in got] == good
    x = np.array([[i / 10, np.float32(1 - i / 10)] for i in good], dtype=np.float32)
    assert [p for _, p in got] == model(torch.from_numpy(x)).argmax(dim=1).tolist()


def test_load_model_does_not_echo_the_password_of_a_malformed_url(aconn):
    secret = "hunter2-do-not-print"
    for url in (f"postgresql://trainer:{secret}@[bad/db", f"postgresql://trainer:{secret}@localhost:notaport/db"):
        with pytest.raises(ConfigError, match="cannot be parsed|port") as failure:
            pgtrain.load_model(url, "clf")
        shown = "".join(traceback.format_exception(failure.value))
        assert secret not in shown and "hunter2" not in shown, shown


def test_predict_from_packed_float32_bytea_checks_each_row(aconn):
    model = commit_random_model(aconn, "reg", 3, 1, hidden_sizes=(4,), task="regression")
    x = np.random.default_rng(2).standard_normal((9, 3)).astype("<f4")
    aconn.execute("CREATE TABLE public.packed (id bigint PRIMARY KEY, features bytea)")
    with aconn.cursor() as cur:
        cur.executemany("INSERT INTO public.packed VALUES (%s, %s)", [(i, row.tobytes()) for i, row in enumerate(x)])
    aconn.execute("INSERT INTO public.packed VALUES (100, %s)", (x[0, :2].tobytes(),))  # 2 values, not 3

    with pytest.raises(SourceError, match=r"wrong_length: 1 rows \(the feature vector does not hold 3 values\), "
                                          r"e.g. keys 100"):
        predict(aconn, "reg", None, "packed", "id", "scores", batch_rows=4)
    done = predict(aconn, "reg", None, "packed", "id", "scores", batch_rows=4, skip_bad_rows=True)

    assert (done.rows, done.skipped) == (9, 1)
    got = np.array([p for (p,) in aconn.execute("SELECT prediction FROM scores ORDER BY id")])
    with torch.no_grad():
        want = model(torch.from_numpy(x.astype(np.float32)))[:, 0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


KEYS = {"bigint": lambda i: i * 7 - 40, "text": lambda i: f"k{i * 7 % 23:02d}-{i}",
        "uuid": lambda i: f"{(i * 2654435761) % (1 << 128):032x}"}


@pytest.mark.parametrize("key_type", sorted(KEYS))
def test_predict_writes_every_key_in_key_order_on_one_connection_or_two(aconn, key_type):
    """Autocommit: a second connection reads while the first writes (one COPY each); in the caller's transaction
    one connection reads a page, then writes it. Either way the predictions are the module's, in key order."""
    model = commit_random_model(aconn, "reg", 3, 1, hidden_sizes=(4,), task="regression")
    x = np.random.default_rng(5).standard_normal((23, 3)).astype(np.float32)
    aconn.execute(f"CREATE TABLE public.items (id {key_type} PRIMARY KEY, features real[])")
    with aconn.cursor() as cur:
        cur.executemany("INSERT INTO public.items VALUES (%s, %s)",
                        [(KEYS[key_type](i), row.tolist()) for i, row in enumerate(x)])
    with torch.no_grad():
        want = dict(zip([KEYS[key_type](i) for i in range(23)], model(torch.from_numpy(x))[:, 0].tolist(),
                        strict=True))

    assert predict(aconn, "reg", None, "items", "id", "two", batch_rows=5).rows == 23
    with aconn.transaction():
        assert predict(aconn, "reg", None, "items", "id", "one", batch_rows=5).rows == 23

    ordered = [k for (k,) in aconn.execute("SELECT id::text AS k FROM items ORDER BY id")]
    for into in ("two", "one"):
        written = aconn.execute(psycopg.sql.SQL("SELECT id::text AS k, prediction FROM {} ORDER BY ctid").format(
            psycopg.sql.Identifier(into))).fetchall()  # in the order written
        assert [k for k, _ in written] == ordered, into
        np.testing.assert_allclose([p for _, p in written], [want[_key(k, key_type)] for k in ordered], atol=1e-5)


def _key(text: str, key_type: str) -> object:
    return int(text) if key_type == "bigint" else text.replace("-", "") if key_type == "uuid" else text


@pytest.mark.parametrize("in_transaction", [False, True], ids=["two_connections", "one_connection"])
def test_predict_judges_array_rows_as_the_loader_does(aconn, in_transaction):
    """NULL, wrong-length, 2-D and NULL-element arrays, NaN, infinity and a double beyond float32's range are bad
    rows, on pages read whole by numpy or row by row: reported (nothing written), or skipped when asked."""
    model = commit_random_model(aconn, "clf", 3, 2, hidden_sizes=(4,))
    x = np.random.default_rng(6).standard_normal((40, 3))
    aconn.execute("CREATE TABLE public.arrays (id integer PRIMARY KEY, features double precision[])")
    with aconn.cursor() as cur:
        cur.executemany("INSERT INTO public.arrays VALUES (%s, %s)", [(i, row.tolist()) for i, row in enumerate(x)])
    bad = {3: None, 4: "{1,2}", 5: "{{1,2,3},{4,5,6}}", 6: "{1,NULL,3}", 17: "{1,NaN,3}", 18: "{1,2,-Infinity}",
           38: "{1e39,2,3}"}
    for key, value in bad.items():
        aconn.execute("UPDATE public.arrays SET features = %s::double precision[] WHERE id = %s", (value, key))

    def scored(**options):
        if not in_transaction:
            return predict(aconn, "clf", None, "arrays", "id", "scores", batch_rows=8, **options)
        with aconn.transaction():
            done = predict(aconn, "clf", None, "arrays", "id", "scores", batch_rows=8, **options)
            aconn.execute("SELECT 1")  # the caller's transaction goes on
            return done

    with pytest.raises(SourceError) as failure:
        scored()
    message = str(failure.value)
    assert "7 rows of public.arrays (of 40) cannot be scored" in message, message
    for kind, keys in (("null_features", "3"), ("wrong_length", "4, 5"), ("null_elements", "6"),
                       ("non_finite", "17, 18"), ("out_of_range", "38")):
        assert f"{kind}: " in message and f"e.g. keys {keys}" in message, message
    assert aconn.execute("SELECT to_regclass('scores')").fetchone() == (None,), "nothing is written"

    done = scored(skip_bad_rows=True)
    assert (done.rows, done.skipped) == (33, 7)
    good = [i for i in range(40) if i not in bad]
    got = aconn.execute("SELECT id, prediction FROM scores ORDER BY ctid").fetchall()
    assert [k for k, _ in got] == good
    assert [p for _, p in got] == model(torch.from_numpy(x[good].astype(np.float32))).argmax(dim=1).tolist()


def test_predict_in_the_callers_transaction_sees_its_uncommitted_rows(aconn):
    model = commit_random_model(aconn, "reg", 2, 1, hidden_sizes=(3,), task="regression")
    aconn.execute("CREATE TABLE public.pending (id bigint PRIMARY KEY, features real[])")
    aconn.execute("INSERT INTO public.pending SELECT i, ARRAY[i, -i]::real[] FROM generate_series(1, 12) AS i")
    with aconn.transaction() as outer:
        aconn.execute("INSERT INTO public.pending VALUES (13, '{13,-13}')")
        assert predict(aconn, "reg", None, "pending", "id", "scores", batch_rows=5).rows == 13
        got = aconn.execute("SELECT prediction FROM scores ORDER BY id").fetchall()
        raise psycopg.Rollback(outer)
    x = np.array([[i, -i] for i in range(1, 14)], np.float32)
    with torch.no_grad():
        np.testing.assert_allclose([p for (p,) in got], model(torch.from_numpy(x))[:, 0].numpy(), atol=1e-4)
    assert aconn.execute("SELECT to_regclass('scores')").fetchone() == (None,), "rolled back with the caller"


def test_predicts_pages_on_one_connection_hold_at_most_batch_rows_rows(aconn):
    """Keyset pages end at the key (not its text form) batch_rows rows on: 1..23 in text order would end the
    first page at 13."""
    from pgtrain.data.source.resolve import resolve_source
    from pgtrain.store import scoring_read

    aconn.execute("CREATE TABLE public.numbered (id bigint PRIMARY KEY, features real[])")
    aconn.execute("INSERT INTO public.numbered SELECT i, ARRAY[i, 1]::real[] FROM generate_series(1, 23) AS i")
    source = resolve_source(aconn, "numbered", "id", None, None, feature_columns=("features",))

    with aconn.transaction():
        pages = list(scoring_read.pages(aconn, source, 2, 5))

    assert [len(p.x) for p in pages] == [5, 5, 5, 5, 3]
    assert np.concatenate([p.x[:, 0] for p in pages]).tolist() == list(range(1, 24))
