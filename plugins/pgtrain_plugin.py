"""Registers pgtrain's models page with Airflow: the api-server mounts the app at /pgtrain and the UI's
navigation gets a "Models" entry showing it. Airflow loads every .py file of the plugins folder;
.airflowignore keeps it out of the pgtrain package, which is a library, not plugins.

Every Airflow process loads the plugins, each task process included, and only the api-server mounts
``fastapi_apps`` (``airflow.api_fastapi.app.init_plugins``; ``airflow plugins`` and /api/v2/plugins list
them too). So the app is built when Airflow first reads the attribute, not at import: importing this file
costs no FastAPI and no Airflow API security module elsewhere.
"""

from functools import cached_property
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from pgtrain.airflow.ui.app import URL_PREFIX


class PgtrainPlugin(AirflowPlugin):
    name = "pgtrain"
    external_views = [{"name": "Models", "href": URL_PREFIX + "/", "destination": "nav", "url_route": "pgtrain-models",
                       "category": "browse"}]

    @cached_property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The models page app, built once per plugin instance on first use (the api-server's mount)."""
        from pgtrain.airflow.ui.app import create_app

        return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "pgtrain models"}]
