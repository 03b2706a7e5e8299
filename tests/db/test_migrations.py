"""Migrations against a real PostgreSQL: idempotent, recorded, refusing edited files, never dropping data."""

from __future__ import annotations

import re
import shutil
import uuid

import psycopg
import psycopg.conninfo
import pytest
from psycopg import sql

from pgtrain.core.errors import ConfigError, PgtrainError
from pgtrain.core.migrations import apply_migrations, discover, sql_dir
from tests.conftest import REPO

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


def operations_grants() -> list[str]:
    """The least-privilege SQL of docs/operations.md, statement by statement, as it is written there."""
    text = (REPO / "docs" / "operations.md").read_text()
    block = re.search(r"## The training database role.*?```sql\n(.*?)```", text, re.S).group(1)
    return [line.split("--")[0].strip() for line in block.splitlines() if line.split("--")[0].strip()]


def test_the_documented_least_privilege_role_provisions_and_a_missing_grant_is_named(make_database):
    """docs/operations.md's grants verbatim (for a role of this test's own name): provision_tables passes once the
    documented first-run CREATE on public is granted, and again after it is revoked; before, the refusal is a
    ConfigError (not retried) naming the GRANT. A role without pgtrain's schema is told to have it created."""
    url = make_database(migrate=False)
    role = f"pgtrain_trainer_{uuid.uuid4().hex[:8]}"
    statements = operations_grants()
    assert statements[0] == "CREATE ROLE pgtrain_trainer LOGIN;" and len(statements) == 5
    as_role = psycopg.conninfo.make_conninfo(url, user=role)
    with psycopg.connect(url, autocommit=True) as admin:
        try:
            for statement in statements:
                admin.execute(statement.replace("pgtrain_trainer", role))
            admin.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM PUBLIC"))  # PostgreSQL 15+'s default
            with psycopg.connect(as_role, autocommit=True) as conn:
                with pytest.raises(ConfigError, match=rf'permission denied for schema public; run GRANT CREATE ON '
                                                      rf'SCHEMA "public" TO "{role}";'):
                    apply_migrations(conn)
                admin.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role)))
                assert apply_migrations(conn) == [m.version for m in discover()]
                admin.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM {}").format(sql.Identifier(role)))
                assert apply_migrations(conn) == []  # later runs touch only pgtrain's own schema
            admin.execute("DROP SCHEMA pgtrain CASCADE")
            with psycopg.connect(as_role, autocommit=True) as conn:
                with pytest.raises(ConfigError, match=rf'permission denied for database .*; run CREATE SCHEMA '
                                                      rf'pgtrain AUTHORIZATION "{role}";'):
                    apply_migrations(conn)
        finally:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_database_migrated_with_001s_earlier_text_is_still_up_to_date(make_database):
    """001 lost its CREATE SCHEMA IF NOT EXISTS (the runner creates the schema, only when missing): a database that
    recorded the earlier text's checksum is not told that 001 changed after it was applied."""
    url = make_database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE pgtrain.schema_migrations SET checksum = %s WHERE version = 1",
                     ("d48c8fb35dc21f1ee3f0658ae1b876b34c61d9e9c43dbad2ed29258ffdc87228",))
        assert apply_migrations(conn) == []
        conn.execute("UPDATE pgtrain.schema_migrations SET checksum = 'something else' WHERE version = 1")
        with pytest.raises(PgtrainError, match="changed after it was applied"):
            apply_migrations(conn)


def test_training_claims_held_across_the_upgrade_to_016_join_their_models_family(make_database, tmp_path):
    """A plain run's claim and a trial's, held while 016 is applied, exclude each other afterwards as claims taken
    after it do (launch.attempt.claim_family)."""
    from pgtrain.launch.attempt import claim_family, claim_name

    for migration in discover():
        if migration.version < 16:
            shutil.copy(migration.path, tmp_path / migration.path.name)
    url = make_database(migrate=False)
    trial = ("pgtrain_training/manual__1", 3)
    held = {claim_name("m"): "pgtrain_training/plain", claim_name("m", trial): f"{trial[0]}/trial-3"}
    with psycopg.connect(url, autocommit=True) as conn:
        apply_migrations(conn, tmp_path)
        for name, run in held.items():
            conn.execute("INSERT INTO pgtrain.locks (name, token, owner, acquired_at, heartbeat_at, expires_at) "
                         "VALUES (%s, nextval('pgtrain.fencing_tokens'), %s, now(), now(), now() + interval '1 hour')",
                         (name, psycopg.types.json.Jsonb({"training_run": run})))
        apply_migrations(conn)
        joined = dict(conn.execute("SELECT name, ARRAY[family, lock_group] FROM pgtrain.locks").fetchall())
    assert joined == {claim_name("m"): list(claim_family("m", "pgtrain_training/plain")),
                      claim_name("m", trial): list(claim_family("m", f"{trial[0]}/trial-3", trial))}
