"""Where a pgtrain process finds the training database URL: an explicit one, ``$PGTRAIN_DATABASE_URL``, or the
file ``$PGTRAIN_DATABASE_URL_FILE`` names (a Kubernetes Secret mounted into a pod). No database driver here:
the MPIJob builder imports these names at DAG parse time."""

from __future__ import annotations

import os
from pathlib import Path

from pgtrain.core.errors import ConfigError

# The one environment variable that carries the training database URL to every pgtrain process.
DATABASE_URL_ENV = "PGTRAIN_DATABASE_URL"
# Where a pod reads the URL instead: a path (not a secret), so launchers may pass it to ranks in the open.
DATABASE_URL_FILE_ENV = "PGTRAIN_DATABASE_URL_FILE"


def database_url(explicit: str | None = None) -> str:
    """The training database URL: an explicit one, else ``$PGTRAIN_DATABASE_URL``, else the contents of the
    file ``$PGTRAIN_DATABASE_URL_FILE`` names (a Kubernetes Secret mounted into a pod)."""
    url = explicit or os.environ.get(DATABASE_URL_ENV)
    if not url and os.environ.get(DATABASE_URL_FILE_ENV):
        path = Path(os.environ[DATABASE_URL_FILE_ENV])
        try:
            url = path.read_text().strip()
        except OSError as error:
            raise ConfigError(f"{DATABASE_URL_FILE_ENV} names {path}, which cannot be read ({error.strerror}): "
                              "is the Secret with the database URL mounted there?") from None
        if not url:
            raise ConfigError(f"{path} (from {DATABASE_URL_FILE_ENV}) is empty: the Secret's key must hold "
                              "the database URL")
    if not url:
        raise ConfigError(
            f"no training database configured: set {DATABASE_URL_ENV} (for example "
            "postgresql://user@host:5432/dbname, password from PGPASSWORD or ~/.pgpass) "
            "or the Airflow connection pgtrain_db"
        )
    return url
