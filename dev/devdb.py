"""An embedded PostgreSQL (the ``pgserver`` package) for the demo and the tests, when no server is configured.

    python -m dev.devdb url DATA_DIR     # start (or reuse) the server in DATA_DIR, print its URL
    python -m dev.devdb stop DATA_DIR
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from types import ModuleType
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql


def _pgserver() -> ModuleType:
    """pgserver, imported here: only the embedded path needs it.

    Its import asks platformdirs for a per-user runtime directory (for a lock file). Without XDG_RUNTIME_DIR (a
    container, an ssh or sudo session without logind) platformdirs takes a private ``runtime-<uid>`` in the
    temporary directory, which it checks (ours, 0700), and warns: on every command that touches the embedded
    server. That fallback is right for a development server, so the warning is not shown."""
    import platformdirs

    runtime_dir_warning = getattr(platformdirs, "RuntimeDirWarning", None)  # older releases do not warn
    with warnings.catch_warnings():
        if runtime_dir_warning is not None:
            warnings.simplefilter("ignore", runtime_dir_warning)
        import pgserver
    return pgserver


def start(data_dir: Path | str, *, stop_at_exit: bool = True) -> str:
    """Start (or attach to) the server in data_dir; returns the URL of its ``postgres`` database."""
    pgserver = _pgserver()
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(Path(data_dir), cleanup_mode="stop" if stop_at_exit else None)
    return server.get_uri("postgres")


def stop(data_dir: Path | str) -> None:
    """Stop the server in data_dir (before its directory is removed)."""
    _pgserver().get_server(Path(data_dir), cleanup_mode="stop").cleanup()


def create_database(admin_url: str, name: str) -> str:
    """Create database ``name`` (dropping an old one of that name); returns its URL."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return database_url_for(admin_url, name)


def database_url_for(url: str, name: str) -> str:
    """The URL of database ``name`` on the server of ``url`` (every other setting kept), as a postgresql:// URI:
    Airflow's AIRFLOW_CONN_* variables take that form too."""
    params = {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(url).items()}
    params.pop("dbname", None)
    user, password = params.pop("user", ""), params.pop("password", "")
    host, port = params.pop("host", ""), params.pop("port", "")
    auth = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
    if host.startswith("/"):  # a unix socket directory goes in the query string
        params = {"host": host, **({"port": port} if port else {}), **params}
        netloc = ""
    else:
        netloc = host + (f":{port}" if port else "")
    query = "?" + urlencode(params, quote_via=quote) if params else ""
    return f"postgresql://{auth}@{netloc}/{quote(name, safe='')}{query}"


def ensure_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return database_url_for(admin_url, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.devdb", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["url", "stop"])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--database", default="pgtrain", help="database to create if missing (url action)")
    args = parser.parse_args(argv)
    if args.action == "url":
        print(ensure_database(start(args.data_dir, stop_at_exit=False), args.database))
    else:
        stop(args.data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
