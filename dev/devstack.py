"""A local Airflow for the UI: api-server, scheduler, dag-processor and triggerer on 127.0.0.1.

    python -m dev.devstack start [--state-dir .airflow-ui] [--port 8080]
    python -m dev.devstack stop  [--state-dir .airflow-ui]

LocalExecutor; the metadata database is the database ``airflow`` of the embedded PostgreSQL in ``.pgdata/``
(the one ``make demo`` uses), and the training database (the Airflow connection ``pgtrain_db``) is its
database ``pgtrain``, or ``$PGTRAIN_DATABASE_URL`` when set. DAGs come from the repository's ``dags/``,
the plugins (the models page, the run notes) from the installed package's entry points. The processes run
detached; their pid files, logs and Airflow's home are in the state directory. Log in with the simple auth
manager's user ``admin`` and the password in ``<state dir>/passwords.json`` (generated at the first start,
mode 0600).

Every Airflow setting is an ``AIRFLOW__...`` variable built in ``airflow_environment`` (one place); database
URLs and signing keys travel in the processes' environment, never on a command line.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dev import devdb

REPO = Path(__file__).resolve().parents[1]
DEFAULT_STATE_DIR = REPO / ".airflow-ui"
DEFAULT_PG_DIR = REPO / ".pgdata"
USERNAME = "admin"
SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")
# The api-server reads task and trigger logs from their files (one machine): no log server listening on every
# interface (Airflow binds its log servers to all of them).
COMMANDS = {"api-server": ["api-server"], "scheduler": ["scheduler", "--skip-serve-logs"],
            "dag-processor": ["dag-processor"], "triggerer": ["triggerer", "--skip-serve-logs"]}
# /api/v2/monitor/health components that must report healthy (metadatabase, and each service's heartbeat)
HEALTH_COMPONENTS = ("metadatabase", "scheduler", "triggerer", "dag_processor")
METADATA_DATABASE = "airflow"
TRAINING_DATABASE = "pgtrain"


class StackError(RuntimeError):
    """The stack did not start (or stop); the message says which service and where its log is."""


@dataclass(frozen=True)
class Stack:
    state_dir: Path
    base_url: str
    username: str

    @property
    def password_file(self) -> Path:
        return self.state_dir / "passwords.json"

    @property
    def password(self) -> str:
        return json.loads(self.password_file.read_text())[self.username]

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def sqlalchemy_urls(url: str) -> tuple[str, str]:
    """(sync, async) SQLAlchemy URLs of a postgresql:// URL (psycopg 2 and asyncpg, the drivers Airflow uses)."""
    if not url.startswith(("postgresql://", "postgres://")):
        raise StackError("the metadata database must be given as a postgresql:// URL")
    rest = url.split("://", 1)[1]
    return f"postgresql+psycopg2://{rest}", f"postgresql+asyncpg://{rest}"


def airflow_environment(state_dir: Path, *, port: int, metadata_url: str, training_url: str,
                        jwt_secret: str, fernet_key: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every Airflow process of the stack: all of its settings, here and nowhere else."""
    sync_url, async_url = sqlalchemy_urls(metadata_url)
    base_url = f"http://127.0.0.1:{port}"
    settings = {
        "AIRFLOW_HOME": str(state_dir / "home"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__FERNET_KEY": fernet_key,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(state_dir / "passwords.json"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sync_url,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": async_url,
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__API_AUTH__JWT_SECRET": jwt_secret,
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(state_dir / "logs" / "tasks"),
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW_CONN_PGTRAIN_DB": training_url,
    }
    return {**os.environ, **settings, **(extra or {})}


def _pid_file(state_dir: Path, service: str) -> Path:
    return state_dir / "pids" / f"{service}.pid"


def _proc_stat(pid: int | str) -> tuple[str, int] | None:
    """(state, process group) of a process from /proc, or None when it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else (fields[0], int(fields[2]))


def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/<pid>/stat after the command name (fields 3 onwards: state, ppid, pgrp, ...), or None when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def _start_time(pid: int | str) -> int | None:
    """When the process started, in clock ticks after boot (stat field 22; a zombie keeps it), or None."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] != "Z"  # a zombie is dead


@dataclass(frozen=True)
class _PidRecord:
    """A service's pid file: its pid, and the start time and boot id that tell it from a later process."""

    pid: int
    start_time: int | None  # None: a pid file of an older pgtrain (pid only)
    boot_id: str | None


def _write_pid_file(state_dir: Path, service: str, pid: int) -> None:
    _pid_file(state_dir, service).write_text(f"{pid} {_start_time(pid)} {_boot_id()}\n")


def _pid_records(state_dir: Path) -> dict[str, _PidRecord | None]:
    """Each service's pid file that exists, parsed (None: unreadable or malformed)."""
    records: dict[str, _PidRecord | None] = {}
    for service in SERVICES:
        path = _pid_file(state_dir, service)
        try:
            fields = path.read_text().split()
        except FileNotFoundError:
            continue
        except OSError:
            records[service] = None
            continue
        try:
            records[service] = _PidRecord(int(fields[0]), int(fields[1]) if len(fields) > 1 else None,
                                          fields[2] if len(fields) > 2 else None)
        except (IndexError, ValueError):
            records[service] = None
    return records


def _cmdline_mentions_airflow(pid: int) -> bool:
    try:
        return b"airflow" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _is_ours(record: _PidRecord | None) -> bool:
    """Whether the pid file still names the service this module started, not a pid the kernel handed to another
    process after a crash or a reboot (signalling that process's group would kill something unrelated)."""
    if record is None or record.pid <= 1:
        return False
    if record.boot_id is not None and record.boot_id != _boot_id():
        return False  # written before a reboot: whatever has the pid now is not ours
    started = _start_time(record.pid)
    if started is not None:  # the leader is alive (or our own unreaped zombie): the same process, or another
        return started == record.start_time if record.start_time is not None else _cmdline_mentions_airflow(
            record.pid)
    # The leader is gone; its group lives while any member does, and a pid is not reused while it names a live
    # group. Members started before the leader are from another group; an old pid file (no start time) needs
    # an Airflow process among them.
    members = group_members(record.pid)
    if record.start_time is not None:
        return all((_start_time(m) or 0) >= record.start_time for m in members)
    return any(_cmdline_mentions_airflow(m) for m in members)


def _service_pids(state_dir: Path) -> dict[str, int]:
    """Each service's pid (the leader of its process group) from its pid file, when it still names that service."""
    return {service: record.pid for service, record in _pid_records(state_dir).items()
            if record is not None and _is_ours(record)}


def running_services(state_dir: Path) -> dict[str, int]:
    return {service: pid for service, pid in _service_pids(state_dir).items() if _alive(pid)}


def _write_password_file(path: Path) -> None:
    """The simple auth manager's passwords file: one generated password for ``admin``, readable by us only."""
    if path.exists():
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump({USERNAME: secrets.token_urlsafe(12)}, file)


def fernet_key(path: Path) -> str:
    """The stack's Fernet key, made once and kept in ``path`` (0600): the metadata database outlives a stop, and
    what it holds encrypted (a watcher's trigger kwargs, connections) must still decrypt at the next start."""
    if not path.exists():
        from cryptography.fernet import Fernet

        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(Fernet.generate_key().decode())
    return path.read_text().strip()


def start(state_dir: Path | str, *, metadata_url: str, training_url: str, port: int | None = None,
          extra_env: Mapping[str, str] | None = None, timeout: float = 900.0) -> Stack:
    """Migrate the metadata database and start the four services detached; returns once the api-server answers
    and every service reports a heartbeat in /api/v2/monitor/health. Raises StackError (and stops what it
    started) when a service exits or ``timeout`` seconds pass."""
    state_dir = Path(state_dir).resolve()
    if running := running_services(state_dir):
        raise StackError(f"an Airflow stack already runs from {state_dir} ({', '.join(running)}); "
                         "stop it first: python -m dev.devstack stop")
    for sub in ("home", "logs", "pids"):
        (state_dir / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    _write_password_file(state_dir / "passwords.json")
    port = port or free_port()
    env = airflow_environment(state_dir, port=port, metadata_url=metadata_url, training_url=training_url,
                              jwt_secret=secrets.token_urlsafe(32), fernet_key=fernet_key(state_dir / "fernet.key"),
                              extra=extra_env)
    airflow = str(Path(sys.executable).parent / "airflow")
    stack = Stack(state_dir, f"http://127.0.0.1:{port}", USERNAME)

    with open(stack.logs_dir / "db-migrate.log", "wb") as log:
        migrated = subprocess.run([airflow, "db", "migrate"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, cwd=REPO, timeout=timeout)
    if migrated.returncode != 0:
        raise StackError(f"airflow db migrate failed; log: {stack.logs_dir / 'db-migrate.log'}")

    deadline = time.monotonic() + timeout
    for service in SERVICES:
        with open(stack.logs_dir / f"{service}.log", "ab") as log:
            process = subprocess.Popen([airflow, *COMMANDS[service]], env=env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True)
        _write_pid_file(state_dir, service, process.pid)
    try:
        wait_healthy(stack, deadline - time.monotonic())
    except BaseException:
        stop(state_dir)
        raise
    return stack


def wait_healthy(stack: Stack, timeout: float) -> dict:
    """Poll /api/v2/monitor/health (no login needed) until the metadata database and every service are healthy."""
    import httpx

    deadline = time.monotonic() + timeout
    last: object = "no answer yet"
    while time.monotonic() < deadline:
        exited = [s for s in SERVICES if s not in running_services(stack.state_dir)]
        if exited:
            raise StackError(f"airflow {exited[0]} exited during startup; log: {stack.logs_dir / (exited[0] + '.log')}")
        try:
            response = httpx.get(f"{stack.base_url}/api/v2/monitor/health", timeout=30)
            if response.status_code == 200:
                health = response.json()
                last = {name: (health.get(name) or {}).get("status") for name in HEALTH_COMPONENTS}
                if all(status == "healthy" for status in last.values()):
                    return health
            else:
                last = f"HTTP {response.status_code}"
        except httpx.HTTPError as error:
            last = type(error).__name__
        time.sleep(2)
    raise StackError(f"the Airflow stack in {stack.state_dir} was not healthy after {timeout:.0f} s "
                     f"(last: {last}); logs: {stack.logs_dir}")


def stop(state_dir: Path | str, timeout: float = 60.0) -> list[str]:
    """SIGTERM every service's process group, then SIGKILL what is left after ``timeout``; returns what stopped.

    A pid file that no longer names the service it was written for (the process is gone and its pid reused,
    after a crash or a reboot) is removed without signalling anything, with a line on stderr."""
    state_dir = Path(state_dir).resolve()
    groups: dict[str, int] = {}
    for service, record in _pid_records(state_dir).items():
        if record is not None and _is_ours(record):  # before _group_exists reaps a zombie leader
            if _group_exists(record.pid):
                groups[service] = record.pid
        elif record is None or _alive(record.pid) or group_members(record.pid):  # something else has the pid
            what = "is unreadable" if record is None else (
                f"names pid {record.pid}, which is no longer the {service} this stack started")
            print(f"{_pid_file(state_dir, service)} {what}: a stale pid file (a crash or a reboot?), "
                  "nothing signalled", file=sys.stderr)
    for pid in groups.values():
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_group_exists(pid) for pid in groups.values()):
        time.sleep(0.5)
    for pid in groups.values():
        if _group_exists(pid):  # a pid is not reused while its group lives: still the service's group
            _signal_group(pid, signal.SIGKILL)
    for service in SERVICES:
        _pid_file(state_dir, service).unlink(missing_ok=True)
    return list(groups)


def _group_exists(pgid: int) -> bool:
    """A process group lives while any member does (a pid is not reused while it names a live group)."""
    try:  # our own zombie leader (the fixture starts the services as its children): reap it
        os.waitpid(pgid, os.WNOHANG)
    except ChildProcessError:
        pass
    return bool(group_members(pgid))


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _proc_stat(entry.name)) and stat[1] == pgid and stat[0] != "Z":
            members.append(int(entry.name))
    return members


def stack_processes(state_dir: Path | str) -> dict[str, list[int]]:
    """Every live process of each service (the service and what it started: workers, task runners, ranks)."""
    return {service: group_members(pid) for service, pid in _service_pids(Path(state_dir).resolve()).items()}


def _signal_group(pid: int, signum: int) -> None:
    """Each service leads its own session (start_new_session): signal its whole group (workers, task runners)."""
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _local_databases(pg_dir: Path) -> tuple[str, str]:
    """(metadata URL, training URL): databases of the embedded PostgreSQL in pg_dir (started if needed);
    the training database is $PGTRAIN_DATABASE_URL when set."""
    admin_url = devdb.start(pg_dir, stop_at_exit=False)
    metadata_url = devdb.ensure_database(admin_url, METADATA_DATABASE)
    training_url = os.environ.get("PGTRAIN_DATABASE_URL") or devdb.ensure_database(admin_url, TRAINING_DATABASE)
    return metadata_url, training_url


def _pg_dir_file(state_dir: Path) -> Path:
    """Where ``start`` (the command) records the embedded PostgreSQL it used, for ``stop`` to name."""
    return Path(state_dir) / "pg-dir"


def _embedded_database_note(state_dir: Path) -> str | None:
    """The line ``stop`` prints about the embedded PostgreSQL the stack used (it keeps running), if it used one."""
    recorded = _pg_dir_file(state_dir)
    if not recorded.exists():
        return None
    pg_dir = Path(recorded.read_text().strip())
    how = "make stop-db" if pg_dir == DEFAULT_PG_DIR.resolve() else f"python -m dev.devdb stop {pg_dir}"
    return f"(the embedded PostgreSQL in {pg_dir}/ keeps running: {how} stops it)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.devstack", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    parser.add_argument("--pg-dir", type=Path, default=DEFAULT_PG_DIR,
                        help="embedded PostgreSQL data directory (start; stop names the one its start used)")
    parser.add_argument("--port", type=int, default=8080, help="api-server port on 127.0.0.1 (0: any free port)")
    args = parser.parse_args(argv)
    if args.action == "stop":
        stopped = stop(args.state_dir)
        print(f"stopped {', '.join(stopped)}" if stopped else f"no Airflow stack running from {args.state_dir}")
        if note := _embedded_database_note(args.state_dir):
            print(note)
        return 0
    metadata_url, training_url = _local_databases(args.pg_dir)
    print(f"starting Airflow (api-server, scheduler, dag-processor, triggerer); logs in {args.state_dir}/logs/ ...")
    try:
        stack = start(args.state_dir, metadata_url=metadata_url, training_url=training_url, port=args.port or None)
    except StackError as error:
        print(f"dev.devstack: {error}", file=sys.stderr)
        return 1
    _pg_dir_file(args.state_dir).write_text(f"{args.pg_dir.resolve()}\n")
    print(f"Airflow UI    {stack.base_url}/")
    print(f"models page   {stack.base_url}/pgtrain/")
    print(f"log in as     {stack.username}, password in {stack.password_file}")
    print(f"              (cat {stack.password_file})")
    print("stop it with  make stop-ui")
    return 0


if __name__ == "__main__":
    sys.exit(main())
