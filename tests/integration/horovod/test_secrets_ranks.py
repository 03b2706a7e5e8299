"""The database password never leaves the launcher while real ranks train: not in ``ps``, not in any environment,
log, record or error. (The pieces, without ranks: tests/unit/test_secrets.py.)"""

from __future__ import annotations

import logging
import os
import uuid
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgtrain.launch import local as launch_local
from pgtrain.runs import record
from tests.support import ProcessWatch, planned_run, seed_samples, with_password


@contextmanager
def password_role(admin_url: str, password: str):
    """A superuser role whose password is ``password``; the embedded server (trust) is made to check it."""
    role = f"pgtrain_secret_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)))
        hba = Path(admin.execute("SHOW hba_file").fetchone()[0])
        original = hba.read_text() if os.access(hba, os.W_OK) else None
        if original is not None:  # our server: this role must authenticate with its password
            hba.write_text(f"local all {role} scram-sha-256\nhost all {role} all scram-sha-256\n{original}")
            admin.execute("SELECT pg_reload_conf()")
        try:
            yield role, original is not None
        finally:
            if original is not None:
                hba.write_text(original)
                admin.execute("SELECT pg_reload_conf()")
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@pytest.mark.horovod
@pytest.mark.parametrize("world_size", [2, 1], ids=["ranks", "alone"])
def test_the_password_is_nowhere_while_ranks_train(db_url, pg_admin_url, sentinel, world_size):
    """Two ranks under horovodrun, and a rank alone (``trainer --alone``), which reads its rows while it imports
    torch: with the password from the passfile, as the rest of the rank."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        seed_samples(conn, rows=1200, dim=16, classes=4)
        run = planned_run(conn, world_size=world_size, epochs=6, hidden_sizes=[16])
    with password_role(pg_admin_url, sentinel) as (role, checked):
        url = with_password(db_url, sentinel).replace("://postgres:", f"://{role}:", 1)
        assert sentinel in url and role in url
        assert checked or os.environ.get("TEST_DATABASE_URL")  # the embedded server can be made to check it
        if checked:  # the server really wants this password: the ranks must get it from the passfile
            with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
                psycopg.connect(url.replace(sentinel, "wrong")).close()
        lines: list[str] = []
        log = logging.getLogger(f"test.secrets.{uuid.uuid4().hex}")
        log.setLevel(logging.INFO)
        handler = logging.Handler()
        handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
        log.addHandler(handler)
        watch = ProcessWatch(sentinel, run.run_id)
        errors = watch.during(lambda: launch_local.run_local(run.run_id, world_size, url, log,
                                                             timeout_seconds=300))

    assert not errors, errors
    assert not watch.leaks, watch.leaks
    assert not any(sentinel in line for line in lines)
    assert any(f"rank {world_size - 1}/{world_size}" in line for line in lines)
    if world_size > 1:  # horovodrun's ranks start with PGPASSFILE in their environment, named by their launcher
        assert watch.rank_scans >= 2 and watch.gloo_command_lines >= 1  # the ranks ran while we looked
        (passfile,) = watch.passfiles
        assert not os.path.exists(passfile) and not os.path.exists(os.path.dirname(passfile))
    else:  # a rank alone names it itself, before its early read of the rows connects
        assert any("while torch was imported" in line for line in lines), lines
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert record.get_run(conn, run.run_id).status == "trained"  # the ranks connected (scram when checked)
        records = conn.execute(
            "SELECT r::text || coalesce((SELECT string_agg(m::text, '') FROM pgtrain.run_metrics m "
            "WHERE m.run_id = r.run_id), '') FROM pgtrain.training_runs r WHERE run_id = %s",
            (run.run_id,)).fetchone()[0]
    assert run.run_id in records and sentinel not in records
