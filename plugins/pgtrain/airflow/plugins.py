"""pgtrain's Airflow plugins, registered through the ``airflow.plugins`` entry point (pyproject.toml): installing
the package into Airflow's environment registers them, with no file in Airflow's plugins folder (a copy there
would register a second plugin of the same name, which Airflow skips and reports as an import error).

- ``PgtrainModelsPlugin``: the models page. The api-server mounts the app at /pgtrain and the UI's navigation
  gets a "Models" entry showing it. It also registers the model DAGs' cron timetable (``NextTickCronTimetable``):
  the dag-processor and the scheduler read a serialized custom timetable back only when a plugin lists it.
- ``PgtrainRunNotesPlugin``: the listener that writes each pgtrain DAG run's outcome into the run's note
  (``pgtrain.airflow.ui.run_notes``); the scheduler (and ``airflow dags test``) call it when a run ends.

Every Airflow process loads the plugins, each task process included, and only the api-server mounts
``fastapi_apps`` (``airflow.api_fastapi.app.init_plugins``; ``airflow plugins`` and /api/v2/plugins list
them too). So the app is built when Airflow first reads the attribute, not at import: importing this module
costs no FastAPI and no Airflow API security module elsewhere.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from pgtrain.airflow.dag.timetable import NextTickCronTimetable
from pgtrain.airflow.ui import run_notes
from pgtrain.airflow.ui.app import URL_PREFIX


class PgtrainModelsPlugin(AirflowPlugin):
    name = "pgtrain"
    external_views = [{"name": "Models", "href": URL_PREFIX + "/", "destination": "nav", "url_route": "pgtrain-models",
                       "category": "browse"}]
    timetables = [NextTickCronTimetable]

    @cached_property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The models page app, built once per plugin instance on first use (the api-server's mount)."""
        from pgtrain.airflow.ui.app import create_app

        return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "pgtrain models"}]


class PgtrainRunNotesPlugin(AirflowPlugin):
    name = "pgtrain_run_notes"
    listeners = [run_notes]
