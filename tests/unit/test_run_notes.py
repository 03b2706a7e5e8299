"""The DAG run's note is rendered as Markdown (CommonMark) by Airflow's UI: what a conf puts in it stays text."""

from __future__ import annotations

import html
import re

import pytest
from markdown_it import MarkdownIt

from pgtrain.airflow.ui.run_notes import markdown_inert

ATTACKS = [
    "refused: feature_columns ['![x](http://127.0.0.1:8765/track.png)'] are not columns of public.t",
    "refused: [click](http://127.0.0.1:8765/) and <http://127.0.0.1:8765/auto> and [ref][r]\n\n[r]: http://127.0.0.1/r",
    "refused: \\![x](http://127.0.0.1:8765/escaped-escape.png)",
    "refused: feature_columns ['<img src=http://127.0.0.1:8765/raw.png>'] are not columns of public.t",
    "refused: ![y][x] and [x]\n\n[x]: http://127.0.0.1:8765/defined",
    "refused: [x\\](http://127.0.0.1:8765/escaped-bracket.png) and <mailto:a@127.0.0.1>",
]


@pytest.mark.parametrize("text", ATTACKS)
def test_a_note_from_a_conf_renders_no_image_or_link_and_reads_the_same(text):
    html = MarkdownIt("commonmark").render(markdown_inert(text))
    assert not re.search(r"<(img|a)\b", html), html
    assert "http://127.0.0.1" in html  # the text is still there, as text
    plain = MarkdownIt("commonmark").render(text)
    assert re.search(r"<(img|a)\b", plain), "the unescaped text would have rendered an image or a link"


@pytest.mark.parametrize("text", ATTACKS)
def test_an_escaped_note_renders_as_its_own_text(text):
    rendered = MarkdownIt("commonmark").render(markdown_inert(text))
    assert " ".join(html.unescape(re.sub(r"<[^>]+>", " ", rendered)).split()) == " ".join(text.split())


@pytest.mark.parametrize("note", [
    "digits-mlp v3 committed: val_accuracy 0.9799, head v2 -> v3",
    "refused in plan_run: feature_columns ['title', 'body'] are not columns of public.posts (its columns: ['id'])",
    "rejected: val_rmse 12.5 > 10 (max_val_rmse); head stays v2 [not promoted] as a < b, C:\\data",
])
def test_an_ordinary_outcome_reads_the_same_raw_as_rendered(note):
    """The REST API returns the note raw: no backslash where nothing needed one (a list's brackets, a comparison)."""
    assert markdown_inert(note) == note
