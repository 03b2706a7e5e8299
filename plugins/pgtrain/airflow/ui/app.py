"""The models page in the Airflow UI: a FastAPI app the api-server mounts at /pgtrain (pgtrain.airflow.plugins).

Every route requires a user logged in to Airflow (the JWT of the Airflow UI's cookie, or a bearer token):
without one a browser is sent to Airflow's login page and any other client gets 401, with nothing of the
store in either answer. Data comes from the training database, the Airflow connection ``pgtrain_db``,
through the read-only queries of ``pgtrain.store.catalog``.

Every Airflow process imports this module through the plugin (for ``URL_PREFIX``), so its module level
imports nothing heavy: FastAPI, psycopg and Airflow's API security load in ``create_app``, which only the
api-server calls. (No ``from __future__ import annotations`` here: FastAPI resolves the routes' annotations,
which name classes imported inside ``create_app``.)
"""

from typing import TYPE_CHECKING, Annotated, Any

from pgtrain.airflow.ui import html as ui_html
from pgtrain.airflow.ui import render as ui_render
from pgtrain.airflow.ui import versions as ui_versions

if TYPE_CHECKING:
    import psycopg
    from fastapi import FastAPI, Request

URL_PREFIX = "/pgtrain"
APPLICATION_NAME = "pgtrain-ui"  # what pg_stat_activity shows for the page's connections
CONNECT_TIMEOUT = 10  # seconds, unless the connection pgtrain_db sets connect_timeout itself


def _connect() -> "psycopg.Connection":
    """An autocommit connection to the training database; its errors never quote the password."""
    from psycopg.conninfo import make_conninfo

    from pgtrain.airflow.dag.connection import database_url
    from pgtrain.core import db

    url = database_url()
    if "connect_timeout" not in db.parse_conninfo(url):
        url = make_conninfo(url, connect_timeout=CONNECT_TIMEOUT)
    return db.connect(url, autocommit=True, application_name=APPLICATION_NAME)


def _roots(request: "Request") -> tuple[str, str]:
    """(this app's root path, the Airflow UI's root path) as the browser sees them."""
    root = request.scope.get("root_path", "").rstrip("/")
    return root, root.removesuffix(URL_PREFIX)


def _relative_url(request: "Request") -> str:
    """The request's path and query, without scheme and host: the Host header is the client's to choose."""
    url = request.url
    return "/" + url.path.lstrip("/") + (f"?{url.query}" if url.query else "")


def create_app() -> "FastAPI":
    import psycopg
    import psycopg.errors
    from airflow.api_fastapi.core_api.security import requires_authenticated
    from fastapi import Depends, FastAPI, HTTPException, Query, Request
    from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

    from pgtrain.core.errors import PgtrainError
    from pgtrain.store import catalog

    # Airflow's own authentication: the dependency Airflow's routes use to resolve the user (401 without one).
    app = FastAPI(title="pgtrain models", dependencies=[Depends(requires_authenticated())],
                  docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def content_security_policy(request: Request, call_next: Any) -> Response:
        # every answer, errors and redirects included: the page's one inline stylesheet, no script, nothing fetched
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = ui_html.CONTENT_SECURITY_POLICY
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.exception_handler(HTTPException)
    async def not_logged_in(request: Request, error: HTTPException) -> Response:
        if error.status_code in (401, 403) and "text/html" in request.headers.get("accept", ""):
            from airflow.api_fastapi.app import get_auth_manager

            login = get_auth_manager().get_url_login(next_url=_relative_url(request))
            return RedirectResponse(login, status_code=303)
        return JSONResponse({"detail": error.detail}, status_code=error.status_code)

    @app.exception_handler(psycopg.OperationalError)
    async def database_down(request: Request, error: psycopg.OperationalError) -> Response:
        # the message of a failed connection names host and user, never the password; keep it out anyway
        return HTMLResponse(ui_html.page("Models", "<p>Cannot reach the training database (the Airflow connection "
                                         "<code>pgtrain_db</code>): " + ui_html.e(type(error).__name__)
                                         + ". Check the connection and that the server is up.</p>",
                                         _roots(request)[0]), status_code=503)

    @app.exception_handler(psycopg.errors.UndefinedTable)
    async def not_set_up(request: Request, error: psycopg.errors.UndefinedTable) -> Response:
        # pgtrain's tables are created by the first run's provision_tables: no model or run exists before it
        return HTMLResponse(ui_render.not_set_up_page(_roots(request)[0]), status_code=404)

    @app.get("/", response_class=HTMLResponse)
    def models(request: Request) -> str:
        root, _ = _roots(request)
        with _connect() as conn:
            try:
                found = catalog.list_models(conn)
            except psycopg.errors.UndefinedTable:  # an empty list, not a missing page
                found = []
        return ui_render.models_page(found, root)

    @app.get("/models/{model_name}", response_class=HTMLResponse)
    def model(request: Request, model_name: str, version: int | None = None) -> str:
        root, airflow_root = _roots(request)
        with _connect() as conn:
            versions = catalog.list_versions(conn, model_name)
            if not versions:
                raise HTTPException(404, f"no model {model_name!r} in the training database")
            history = catalog.head_history(conn, model_name)
            configs = catalog.version_configs(conn, model_name)
            if version is None:
                version = next((v for v in versions if v["is_head"]), versions[-1])["version"]
            shown = catalog.version_details(conn, model_name, [version])
            if not shown:
                raise HTTPException(404, f"model {model_name!r} has no version {version}")
        return ui_versions.model_page(model_name, versions, history, shown[0], root, airflow_root, configs)

    @app.get("/models/{model_name}/compare", response_class=HTMLResponse)
    def compare(request: Request, model_name: str, v: Annotated[list[int] | None, Query()] = None) -> Response:
        root, _ = _roots(request)
        asked = list(dict.fromkeys(v or []))
        if not 2 <= len(asked) <= ui_versions.MAX_COMPARED:
            return HTMLResponse(ui_html.page(
                f"Compare {model_name}", f"<p>Compare takes 2 to {ui_versions.MAX_COMPARED} different versions "
                f"(got {len(asked)}): check them in the versions table of "
                f"{ui_html.link(ui_html.model_href(root, model_name), model_name)} and press Compare.</p>", root),
                status_code=400)
        with _connect() as conn:
            compared = catalog.version_details(conn, model_name, asked)
        missing = sorted(set(asked) - {d["version"] for d in compared})
        if missing:
            raise HTTPException(404, f"model {model_name!r} has no version {', '.join(map(str, missing))}")
        return HTMLResponse(ui_versions.compare_page(model_name, compared, root))

    @app.get("/runs", response_class=HTMLResponse)
    def run(request: Request, run_id: str) -> str:
        root, airflow_root = _roots(request)
        with _connect() as conn:
            try:
                overview: dict[str, Any] = catalog.run_overview(conn, run_id)
            except PgtrainError:
                raise HTTPException(404, f"no training run {run_id!r}") from None
        return ui_render.run_page(overview, root, airflow_root)

    return app
