"""Connections and identifier handling. Every other module gets its connections here.

A database URL may carry a password; no error, log line or child process may. Parsing errors are
raised as ConfigError with the password redacted (libpq quotes a malformed URI whole).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgtrain.core.database_url import database_url
from pgtrain.core.errors import ConfigError

# The custom setting that carries a trainer's attempt on its connection; 007's triggers compare it
# with training_runs.attempt and refuse writes of an older attempt.
ATTEMPT_SETTING = "pgtrain.attempt"
REDACTED = "********"
# Settings whose values are secrets (libpq has no other secret-bearing keyword).
SECRET_KEYWORDS = ("password", "sslpassword")
_URI_USERINFO = re.compile(r"^\s*[a-z][a-z0-9+.-]*://([^@/?#]*)@", re.IGNORECASE)
_KEYWORD_SECRET = re.compile(r"(?:^|[\s?&])(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE)


def secrets_in(url: str) -> set[str]:
    """Every spelling of a secret the URL (or key=value string) carries, parsable or not."""
    found: set[str] = set()
    match = _URI_USERINFO.match(url)
    if match and ":" in match.group(1):
        found.add(match.group(1).split(":", 1)[1])
    for value in _KEYWORD_SECRET.findall(url):
        found.add(value[1:-1] if value.startswith("'") and value.endswith("'") else value)
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        params = {}
    found |= {str(params[key]) for key in SECRET_KEYWORDS if params.get(key)}
    found |= {unquote(value) for value in found}
    return {value for value in found if value}


def redact(text: str, url: str) -> str:
    """``text`` with every secret of ``url`` replaced (longest first, so no fragment of one survives)."""
    for secret in sorted(secrets_in(url), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def parse_conninfo(url: str) -> dict[str, str]:
    """The URL's libpq settings; a malformed URL raises ConfigError that does not quote its password."""
    try:
        params = {key: str(value) for key, value in conninfo_to_dict(url).items()}
    except psycopg.Error as error:
        raise ConfigError(
            f"the training database URL cannot be parsed: {redact(str(error), url)}; write it as "
            "postgresql://user@host:5432/dbname or host=... dbname=... (password from PGPASSWORD or ~/.pgpass)"
        ) from None
    for port in filter(None, params.get("port", "").split(",")):
        if not port.strip().isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"the training database URL has port {redact(port, url)!r}: a port is a number "
                              "from 1 to 65535")
    return params


def split_password(url: str) -> tuple[str, str | None]:
    """(the URL as a libpq key=value string without its password, the password or None)."""
    params = parse_conninfo(url)
    if params.get("sslpassword"):
        raise ConfigError("the training database URL carries sslpassword, which cannot reach the ranks "
                          "safely; use a client key without a passphrase (mode 0600) instead")
    password = params.pop("password", None) or None
    return make_conninfo(**params), password


def connect(url: str | None = None, *, autocommit: bool = True, attempt: int | None = None,
            application_name: str = "pgtrain") -> psycopg.Connection:
    """A connection to the training database; ``attempt`` marks it as that train attempt's (writes are fenced).

    Errors never quote the password: a malformed URL raises ConfigError, a failed connection psycopg's error.
    """
    url = database_url(url)
    params = parse_conninfo(url)
    params["application_name"] = application_name
    if attempt is not None:
        params["options"] = f"{params.get('options', '')} -c {ATTEMPT_SETTING}={int(attempt)}".strip()
    try:
        return psycopg.connect(autocommit=autocommit, **params)
    except psycopg.Error as error:
        message = redact(str(error), url)
        if message == str(error):
            raise
        raise type(error)(message) from None


# A rank's first connection: every rank of a job connects at once (8 per GPU node), into a server or PgBouncer that
# may be restarting or briefly full; a few tries over about half a minute, then the error.
CONNECT_TRIES = 6
CONNECT_FIRST_WAIT = 1.0


def connect_retrying(url: str | None = None, *, tries: int = CONNECT_TRIES, first_wait: float = CONNECT_FIRST_WAIT,
                     sleep: Callable[[float], None] = time.sleep, **kwargs: Any) -> psycopg.Connection:
    """``connect`` tried up to ``tries`` times while the connection itself fails (psycopg's OperationalError: the
    server down, restarting or out of connection slots), waiting ``first_wait`` seconds, then twice as long each time,
    with jitter so that a job's ranks do not come back together. A bad URL (ConfigError) is not retried, and nothing
    after the connection is: a query's error is the caller's."""
    for attempt in range(1, tries + 1):
        try:
            return connect(url, **kwargs)
        except psycopg.OperationalError as error:
            if attempt == tries:
                raise
            wait = first_wait * 2 ** (attempt - 1) * random.uniform(0.5, 1.0)
            print(f"could not connect to the training database (try {attempt} of {tries}: "
                  f"{str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__}); "
                  f"trying again in {wait:.1f} s", flush=True)
            sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def connect_like(conn_or_url: psycopg.Connection | str, application_name: str) -> psycopg.Connection:
    """A new autocommit connection to the same database as ``conn_or_url`` (a connection or URL), as the same
    user; errors never quote the password."""
    if isinstance(conn_or_url, str):
        return connect(conn_or_url, application_name=application_name)
    kwargs: dict[str, Any] = {"autocommit": True, "application_name": application_name}
    if conn_or_url.info.password:
        kwargs["password"] = conn_or_url.info.password
    return psycopg.connect(conn_or_url.info.dsn, **kwargs)
