"""The models page's HTML building blocks: escaping, links, and the page shell with its stylesheet.

Everything a page shows passes through ``e`` (model names, column names and config values are the users' to
choose). The stylesheet (``style.css`` beside this module) is inlined into every page, and the page's Content
Security Policy (``CONTENT_SECURITY_POLICY``, which the app sends with each answer) allows that one stylesheet by
its hash and nothing else: no script, no other style, no image, font or frame from anywhere, and forms only to
this app. Inlined rather than linked because Airflow embeds the page in a sandboxed iframe (an opaque origin),
whose requests for a linked stylesheet would carry no login cookie.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

STYLE = (Path(__file__).with_name("style.css")).read_text(encoding="utf-8")
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
CONTENT_SECURITY_POLICY = (f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self'; "
                           "base-uri 'none'; frame-ancestors 'self'")


def e(value: Any) -> str:
    """Escaped text of any value (None shows as a dash)."""
    return "-" if value is None else escape(str(value), quote=True)


def when(value: datetime | None) -> str:
    return e(value.isoformat(sep=" ", timespec="seconds") if value else None)


def number(value: Any) -> str:
    if isinstance(value, float):
        return e(f"{value:.4g}")
    return e(value)


def page(title: str, body: str, root: str, crumbs: str = "") -> str:
    """A whole page: ``crumbs`` (links, already escaped) after "Models" in the navigation bar."""
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"color-scheme\" content=\"light dark\"><title>{e(title)}</title>"
            f"<style>{STYLE}</style></head><body><nav class=\"crumbs\"><a href=\"{e(root)}/\">Models</a>{crumbs}"
            f"</nav><main><h1>{e(title)}</h1>{body}</main></body></html>")


def model_href(root: str, model_name: str, *, version: int | None = None) -> str:
    href = f"{root}/models/{quote(model_name, safe='')}"
    return f"{href}?{urlencode({'version': version})}" if version is not None else href


def compare_href(root: str, model_name: str, versions: list[int]) -> str:
    return f"{model_href(root, model_name)}/compare?{urlencode([('v', v) for v in versions])}"


def run_href(root: str, run_id: str) -> str:
    return f"{root}/runs?{urlencode({'run_id': run_id})}"


def dag_run_href(airflow_root: str, dag_id: str, dag_run_id: str) -> str:
    """The Airflow UI's page of a DAG run."""
    return f"{airflow_root}/dags/{quote(dag_id, safe='')}/runs/{quote(dag_run_id, safe='')}"


def link(href: str, text: Any, *, top: bool = False) -> str:
    target = ' target="_top"' if top else ""
    return f'<a href="{e(href)}"{target}>{e(text)}</a>'


def version_label(version: int | None) -> str:
    return e(None if version is None else f"v{version}")
