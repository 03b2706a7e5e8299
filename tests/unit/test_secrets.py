"""The database password never leaves the launcher: not in ``ps``, not in any environment, log, record or error.
(While real ranks train: tests/integration/horovod/test_secrets_ranks.py.)"""

from __future__ import annotations

import os
import stat
import traceback
from pathlib import Path

import psycopg
import pytest

from pgtrain.core import db
from pgtrain.core.errors import ConfigError
from pgtrain.launch import local as launch_local


@pytest.mark.parametrize("template", [
    "postgresql://u:{pw}@localhost:notaport/db",
    "postgresql://u:{pw}@[bad/db",  # libpq quotes the whole URI in this one
    "postgresql://u:{pw}%zz@localhost/db",
    "host=localhost password={pw} port=abc",
    "host=localhost password='{pw}' port=99999",
    "postgresql://u@localhost/db?password={pw}&port=x",
])
def test_a_malformed_url_fails_without_its_password(template, sentinel):
    url = template.format(pw=sentinel)
    with pytest.raises(ConfigError) as failure:
        db.connect(url)
    shown = "".join(traceback.format_exception(failure.value))
    assert "training database URL" in shown
    assert sentinel not in shown and sentinel[:-4] not in shown


def test_a_failed_connection_does_not_quote_the_password(sentinel, tmp_path):
    url = f"postgresql://u:{sentinel}@/db?host={tmp_path}&port=1"  # no server listens there
    with pytest.raises(psycopg.OperationalError) as failure:
        db.connect(url)
    assert sentinel not in "".join(traceback.format_exception(failure.value))


def test_the_ranks_get_the_url_without_its_password(sentinel):
    rank_url, password = db.split_password(f"postgresql://trainer:{sentinel}@db.example:5433/training?sslmode=require")
    assert password == sentinel and sentinel not in rank_url
    assert psycopg.conninfo.conninfo_to_dict(rank_url) == {
        "user": "trainer", "host": "db.example", "port": "5433", "dbname": "training", "sslmode": "require"}
    assert db.split_password("postgresql://trainer@db.example/training")[1] is None
    with pytest.raises(ConfigError, match="sslpassword"):
        db.split_password("host=h sslpassword=x")


def test_the_ranks_environment_is_allow_listed(sentinel):
    worker = {"PATH": "/usr/bin", "HOME": "/home/a", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "2",
              "GOMP_SPINCOUNT": "10000", "HOROVOD_LOG_LEVEL": "info", "PGHOST": "db", "PGPASSWORD": sentinel,
              "AWS_SECRET_ACCESS_KEY": sentinel,
              "AIRFLOW_CONN_PGTRAIN_DB": f"postgresql://u:{sentinel}@db/x", "PGTRAIN_DATABASE_URL": sentinel}
    passfile = launch_local.Passfile({"PGPASSFILE": "/tmp/x/pgpass"})
    env = launch_local.rank_environment(worker, "host=db user=u", passfile)
    assert sentinel not in repr(env)
    assert env == {"PATH": "/usr/bin", "HOME": "/home/a", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "2",
                   "GOMP_SPINCOUNT": "10000", "HOROVOD_LOG_LEVEL": "info", "PGHOST": "db",
                   "PGTRAIN_DATABASE_URL": "host=db user=u",
                   "PYTHONUNBUFFERED": "1", "PGPASSFILE": "/tmp/x/pgpass"}


def test_the_passfile_is_private_escaped_and_on_no_disk():
    with launch_local.private_passfile("a:b\\c") as passfile:
        (fd,) = passfile.fds
        assert passfile.environment == {"PGTRAIN_PASSFILE_FD": str(fd)}
        path = Path(f"/proc/{os.getpid()}/fd/{fd}")  # how horovodrun names it to the ranks
        assert os.readlink(path).startswith("/memfd:")
        assert stat.S_ISREG(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600  # what libpq wants
        assert path.read_text() == "*:*:*:*:a\\:b\\\\c\n"
    assert not path.exists()
    with launch_local.private_passfile(None) as nothing:
        assert nothing is None


def test_without_memfds_the_passfile_is_a_private_file_removed_on_exit(monkeypatch):
    monkeypatch.delattr(os, "memfd_create")  # as on macOS
    with launch_local.private_passfile("a:b\\c") as passfile:
        assert passfile.fds == ()
        file = Path(passfile.environment["PGPASSFILE"])
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
        assert stat.S_IMODE(file.parent.stat().st_mode) == 0o700
        assert file.read_text() == "*:*:*:*:a\\:b\\\\c\n"
    assert not file.exists() and not file.parent.exists()
