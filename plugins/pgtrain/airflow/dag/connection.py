"""The training database as an Airflow connection (``pgtrain_db`` by default; AIRFLOW_CONN_PGTRAIN_DB works).

Resolved through the postgres provider's ``PostgresHook``, so secrets backends, connection extras and
IAM tokens behave as they do for any Postgres connection in Airflow; pgtrain then connects with psycopg 3.
"""

from __future__ import annotations

DEFAULT_CONN_ID = "pgtrain_db"


def database_url(conn_id: str = DEFAULT_CONN_ID) -> str:
    """A libpq connection string built from the connection's fields (password included: never log it). A connection
    that is not defined is a ConfigError saying how to define it: no retry defines it."""
    from airflow.providers.postgres.hooks.postgres import PostgresHook
    from airflow.sdk.exceptions import AirflowNotFoundException
    from psycopg.conninfo import make_conninfo
    from psycopg.pq import Conninfo

    from pgtrain.core.errors import ConfigError

    hook = PostgresHook(postgres_conn_id=conn_id)
    try:
        connection = hook.connection
    except AirflowNotFoundException as error:
        raise ConfigError(
            f"{error}: define the training database's Airflow connection, e.g. the environment variable "
            f"AIRFLOW_CONN_{conn_id.upper()}='postgresql://USER@HOST:5432/DBNAME' on the scheduler and workers, "
            f"`airflow connections add {conn_id} --conn-uri ...`, or your secrets backend (the password from "
            "the backend, never in the DAG files)") from None
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
