"""Migrations against a real PostgreSQL: idempotent, recorded, refusing edited files, never dropping data."""

from __future__ import annotations

import shutil

import psycopg
import pytest

from pgtrain.core.errors import PgtrainError
from pgtrain.core.migrations import apply_migrations, discover, sql_dir

SCHEMA_QUERY = """
    SELECT table_schema, table_name, column_name, data_type, is_nullable
    FROM information_schema.columns WHERE table_schema IN ('pgtrain', 'public')
    ORDER BY 1, 2, 3"""


def test_migrations_apply_twice_without_change(make_database):
    url = make_database(migrate=False)
    with psycopg.connect(url, autocommit=True) as conn:
        first = apply_migrations(conn)
        schema = conn.execute(SCHEMA_QUERY).fetchall()
        recorded = conn.execute("SELECT version, checksum FROM pgtrain.schema_migrations ORDER BY 1").fetchall()
        second = apply_migrations(conn)
        assert first == [m.version for m in discover()]
        assert second == []
        assert conn.execute(SCHEMA_QUERY).fetchall() == schema
        assert conn.execute("SELECT version, checksum FROM pgtrain.schema_migrations ORDER BY 1").fetchall() == recorded
    tables = {row[1] for row in schema}
    assert {"training_runs", "shard_manifest", "run_metrics", "staged_parameters", "locks", "model_versions",
            "model_heads", "samples"} <= tables


def test_reapplying_keeps_user_rows(conn):
    conn.execute("INSERT INTO public.samples (features, label) VALUES ('{1,2}', 1)")
    conn.commit()
    apply_migrations(conn)
    assert conn.execute("SELECT count(*) FROM public.samples").fetchone()[0] == 1


def test_an_edited_applied_migration_is_refused(conn, tmp_path, monkeypatch):
    for migration in discover():
        shutil.copy(migration.path, tmp_path / migration.path.name)
    first = sorted(tmp_path.glob("*.sql"))[0]
    first.write_text(first.read_text() + "\n-- edited\n")
    monkeypatch.setenv("PGTRAIN_SQL_DIR", str(tmp_path))
    assert sql_dir() == tmp_path
    with pytest.raises(PgtrainError, match="changed after it was applied"):
        apply_migrations(conn)


def test_badly_named_migration_file_is_refused(tmp_path):
    (tmp_path / "001_ok.sql").write_text("SELECT 1;")
    (tmp_path / "two.sql").write_text("SELECT 1;")
    with pytest.raises(PgtrainError, match="NNN_name.sql"):
        discover(tmp_path)
