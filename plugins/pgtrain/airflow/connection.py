"""The training database as an Airflow connection (``pgtrain_db`` by default; AIRFLOW_CONN_PGTRAIN_DB works)."""

from __future__ import annotations

from airflow.sdk import BaseHook

DEFAULT_CONN_ID = "pgtrain_db"


def database_url(conn_id: str = DEFAULT_CONN_ID) -> str:
    """A libpq connection string built from the connection's fields (password included: never log it)."""
    from psycopg.conninfo import make_conninfo
    from psycopg.pq import Conninfo

    connection = BaseHook.get_connection(conn_id)
    libpq_keywords = {option.keyword.decode() for option in Conninfo.get_defaults()}
    # Extras that are libpq settings pass through (a socket directory and its port arrive there from a URI).
    fields = {key: value for key, value in (connection.extra_dejson or {}).items() if key in libpq_keywords}
    fields |= {key: value for key, value in {
        "host": connection.host, "port": connection.port, "dbname": connection.schema,
        "user": connection.login, "password": connection.password}.items() if value not in (None, "")}
    return make_conninfo(**fields)
