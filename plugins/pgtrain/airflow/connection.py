"""The training database as an Airflow connection (``pgtrain_db`` by default; AIRFLOW_CONN_PGTRAIN_DB works)."""

from __future__ import annotations

from airflow.sdk import BaseHook

DEFAULT_CONN_ID = "pgtrain_db"


def database_url(conn_id: str = DEFAULT_CONN_ID) -> str:
    """A libpq connection string built from the connection's fields (password included: never log it)."""
    from psycopg.conninfo import make_conninfo

    connection = BaseHook.get_connection(conn_id)
    extra = connection.extra_dejson or {}
    fields = {
        "host": connection.host or extra.get("host"),
        "port": connection.port,
        "dbname": connection.schema or extra.get("dbname"),
        "user": connection.login,
        "password": connection.password,
        **{key: value for key, value in extra.items() if key in ("sslmode", "sslrootcert", "connect_timeout")},
    }
    return make_conninfo(**{key: value for key, value in fields.items() if value not in (None, "")})
