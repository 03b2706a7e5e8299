"""The training database as an Airflow connection (``pgtrain_db`` by default; AIRFLOW_CONN_PGTRAIN_DB works).

Resolved through the postgres provider's ``PostgresHook``, so secrets backends, connection extras and
IAM tokens behave as they do for any Postgres connection in Airflow; pgtrain then connects with psycopg 3.
"""

from __future__ import annotations

DEFAULT_CONN_ID = "pgtrain_db"


def database_url(conn_id: str = DEFAULT_CONN_ID) -> str:
    """A libpq connection string built from the connection's fields (password included: never log it)."""
    from airflow.providers.postgres.hooks.postgres import PostgresHook
    from psycopg.conninfo import make_conninfo
    from psycopg.pq import Conninfo

    hook = PostgresHook(postgres_conn_id=conn_id)
    connection = hook.connection
    extras = connection.extra_dejson or {}
    login, password, port = connection.login, connection.password, connection.port
    if extras.get("iam"):
        login, password, port = hook.get_iam_token(connection)
    libpq_keywords = {option.keyword.decode() for option in Conninfo.get_defaults()}
    # Extras that are libpq settings pass through (a socket directory and its port arrive there from a URI);
    # the provider's own extras (iam, cursor, ...) are not libpq keywords and stay behind.
    fields = {key: value for key, value in extras.items()
              if key in libpq_keywords and key not in hook.ignored_extra_options}
    fields |= {key: value for key, value in {
        "host": connection.host, "port": port, "dbname": hook.database or connection.schema,
        "user": login, "password": password}.items() if value not in (None, "")}
    return make_conninfo(**fields)
