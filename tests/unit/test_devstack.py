"""dev.devstack's stop signals only the process groups its pid files still name: a pid file left by a crash or
a reboot, whose pid now belongs to another process, is removed with a message and nothing is signalled.
Real processes (sleep, each leading its own session as the services do); no Airflow needed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev import devstack
from tests.conftest import REPO


@pytest.fixture
def unrelated() -> Iterator[subprocess.Popen]:
    """A process leading its own group that the stack did not start (the pid a stale pid file may name now)."""
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def pid_file(state_dir: Path, service: str, text: str) -> Path:
    path = devstack._pid_file(state_dir, service)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("stale", ["other start time", "other boot", "pid only, no airflow", "garbage"])
def test_stop_leaves_a_process_that_a_stale_pid_file_names_alone(tmp_path, unrelated, capsys, stale):
    pid = unrelated.pid
    started = devstack._start_time(pid)
    text = {"other start time": f"{pid} {started + 1} {devstack._boot_id()}",
            "other boot": f"{pid} {started} not-this-boot",
            "pid only, no airflow": str(pid),
            "garbage": "not a pid"}[stale]
    path = pid_file(tmp_path, "scheduler", text)
    assert devstack.running_services(tmp_path) == {}

    assert devstack.stop(tmp_path, timeout=5) == []
    assert unrelated.poll() is None, "the unrelated process was signalled"
    assert not path.exists()
    assert "stale pid file" in capsys.readouterr().err


def test_stop_signals_the_group_its_pid_file_names(tmp_path, unrelated):
    (tmp_path / "pids").mkdir()
    devstack._write_pid_file(tmp_path, "triggerer", unrelated.pid)
    assert devstack.running_services(tmp_path) == {"triggerer": unrelated.pid}

    assert devstack.stop(tmp_path, timeout=5) == ["triggerer"]
    assert unrelated.wait(timeout=10) is not None
    assert not devstack._pid_file(tmp_path, "triggerer").exists()


def test_the_fernet_key_is_made_once_and_kept_private(tmp_path):
    """A stop/start cycle must not change the key: the metadata database keeps what it encrypted with it (an
    unpaused watcher's trigger kwargs), and a new key made the triggerer die with InvalidToken."""
    from cryptography.fernet import Fernet

    path = tmp_path / "fernet.key"
    first = devstack.fernet_key(path)
    token = Fernet(first.encode()).encrypt(b"trigger kwargs")
    assert devstack.fernet_key(path) == first  # the next start
    assert Fernet(devstack.fernet_key(path).encode()).decrypt(token) == b"trigger kwargs"
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("pg_dir", ["default", "other", None])
def test_stop_names_the_embedded_database_its_start_used(tmp_path, capsys, pg_dir):
    """`stop` names the data directory `start --pg-dir` used (and how to stop it), or none when start used none."""
    used = {"default": devstack.DEFAULT_PG_DIR.resolve(), "other": tmp_path / "elsewhere", None: None}[pg_dir]
    if used is not None:
        devstack._pg_dir_file(tmp_path).write_text(f"{used}\n")  # what start records

    assert devstack.main(["stop", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"no Airflow stack running from {tmp_path}")
    if pg_dir is None:
        assert "PostgreSQL" not in out and ".pgdata" not in out
    else:
        how = "make stop-db" if pg_dir == "default" else f"python -m dev.devdb stop {used}"
        assert f"the embedded PostgreSQL in {used}/ keeps running: {how} stops it" in out
        assert (".pgdata" in out) == (pg_dir == "default")


def test_touching_the_embedded_server_does_not_warn_of_a_missing_runtime_directory():
    """Every `python -m dev.devdb` / `dev.devstack` call imports pgserver, which asks platformdirs for a runtime
    directory: without XDG_RUNTIME_DIR that printed a RuntimeDirWarning on each call."""
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}

    def stderr_of(code: str) -> str:
        result = subprocess.run([sys.executable, "-W", "default", "-c", code], env=env, cwd=REPO,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stderr

    assert "XDG_RUNTIME_DIR" in stderr_of("import pgserver")  # what a plain import says here
    assert "XDG_RUNTIME_DIR" not in stderr_of("from dev import devdb; devdb._pgserver()")
