"""Registers pgtrain's models page with Airflow: the api-server mounts the app at /pgtrain and the UI's
navigation gets a "Models" entry showing it. Airflow loads every .py file of the plugins folder;
.airflowignore keeps it out of the pgtrain package, which is a library, not plugins."""

from airflow.plugins_manager import AirflowPlugin

from pgtrain.airflow.ui import URL_PREFIX, create_app


class PgtrainPlugin(AirflowPlugin):
    name = "pgtrain"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "pgtrain models"}]
    external_views = [{"name": "Models", "href": URL_PREFIX + "/", "destination": "nav", "url_route": "pgtrain-models",
                       "category": "browse"}]
