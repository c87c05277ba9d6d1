"""A site's CSV file: every schema error names file, row and column; valid files load exactly."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from fedsec.fl_core.csv_data import (
    CsvSchema,
    SiteDataError,
    load_client_csv,
    read_site_csv,
)
from fedsec.fl_core.errors import InvalidParameterError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SCHEMA = CsvSchema(label="y", classes=[0, 1], features=["a", "b"])


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("text,row,column,words", [
    ("a,y\n1,0\n", 1, "b", "missing from the header"),
    ("a,b\n1,2\n", 1, "y", "missing from the header"),
    ("a,b,y,z\n1,2,0,5\n", 1, "z", "not in the schema"),
    ("a,b,y,a\n1,2,0,1\n", 1, "a", "names this column twice"),
    ("a,b,y\n1,2,0\n3,x,1\n", 3, "b", "is not a number"),
    ("a,b,y\n1,2,0\n3,,1\n", 3, "b", "is empty"),
    ("a,b,y\n1,2,0\n1,2,1\nnan,2,1\n", 4, "a", "is NaN"),
    ("a,b,y\n1,2,0\n1,-inf,1\n", 3, "b", "is infinite"),
    ("a,b,y\n1,2,0\n1,1e39,1\n", 3, "b", "float32 range"),
    ("a,b,y\n1,2,0\n1,2,2\n", 3, "y", "not one of the declared classes"),
    ("a,b,y\n1,2,0\n1,2,yes\n", 3, "y", "not one of the declared classes"),
    ("a,b,y\n1,2,0\n1,2,\n", 3, "y", "is empty"),
    ("a,b,y\n1,2,0\n1,2\n", 3, None, "has 2 fields, the header has 3"),
    ("a,b,y\n1,2,0\n\n\n1,2,x\n", 5, "y", "declared classes"),
    ("", 1, None, "empty"),
    ("\n\n", 1, None, "empty"),
    ("a,b,y\n", None, None, "no data rows"),
    ("a,,y\n1,2,0\n", 1, None, "has no column name"),
])
def test_each_schema_error_names_the_file_row_and_column(tmp_path, text, row, column, words):
    path = write(tmp_path / "site.csv", text)
    with pytest.raises(SiteDataError) as caught:
        read_site_csv(path, SCHEMA)
    error = caught.value
    assert isinstance(error, ValueError)
    assert (error.row, error.column) == (row, column)
    message = str(error)
    assert message.startswith(str(path)) and words in message
    if row is not None:
        assert f"row {row}" in message
    if column is not None:
        assert f"column {column!r}" in message


def test_messages_never_quote_the_cell(tmp_path):
    path = write(tmp_path / "s.csv", "a,b,y\n1,secret-value,0\n")
    with pytest.raises(SiteDataError) as caught:
        read_site_csv(path, SCHEMA)
    assert "secret" not in str(caught.value)


def test_a_missing_file_and_bad_bytes_are_site_errors(tmp_path):
    with pytest.raises(SiteDataError, match="cannot be read"):
        read_site_csv(tmp_path / "none.csv", SCHEMA)
    path = tmp_path / "latin.csv"
    path.write_bytes(b"a,b,y\n1,\xe9,0\n")
    with pytest.raises(SiteDataError, match="not UTF-8"):
        read_site_csv(path, SCHEMA)
    quoted = write(tmp_path / "quoted.csv", 'a,b,y\n1,2,0\n1,"2"x,1\n')
    with pytest.raises(SiteDataError, match="not valid CSV near line 3"):
        read_site_csv(quoted, SCHEMA)


def test_columns_match_by_name_in_any_order_labels_by_text_or_number(tmp_path):
    path = write(tmp_path / "s.csv", "\ufeffy, b ,a\n1.0,2.5,-1\n0,4,3e2\n 1 ,0,0\n")
    records, features = read_site_csv(path, SCHEMA)
    assert features == ("a", "b")
    np.testing.assert_array_equal(records.x, np.array([[-1, 2.5], [300, 4], [0, 0]], np.float32))
    np.testing.assert_array_equal(records.y, [1, 0, 1])
    words = CsvSchema(label="y", classes=["benign", "malignant"])
    path = write(tmp_path / "w.csv", "f,y\n1,malignant\n2,benign\n")
    records, features = read_site_csv(path, words)
    assert features == ("f",) and records.y.tolist() == [1, 0]


def test_default_features_are_every_other_column_in_header_order(tmp_path):
    path = write(tmp_path / "s.csv", "c,y,a\n1,0,2\n")
    records, features = read_site_csv(path, CsvSchema(label="y", classes=[0, 1]))
    assert features == ("c", "a") and records.x.tolist() == [[1.0, 2.0]]


def test_schema_refuses_bad_declarations():
    with pytest.raises(InvalidParameterError):
        CsvSchema(label="y", classes=[1])
    with pytest.raises(InvalidParameterError):
        CsvSchema(label="y", classes=["1", "1.0"])
    with pytest.raises(InvalidParameterError):
        CsvSchema(label="y", classes=[0, 1], features=["a", "y"])
    with pytest.raises(InvalidParameterError):
        CsvSchema(label="", classes=[0, 1])
    with pytest.raises(InvalidParameterError):
        CsvSchema(label="y", classes=[0, 1], features=["a", "a"])


def _site(tmp_path, n: int, name="s.csv"):
    rng = np.random.default_rng(n)
    rows = ["a,b,y"] + [f"{rng.normal():.6f},{rng.normal():.6f},{int(rng.random() < 0.4)}"
                        for _ in range(n)]
    return write(tmp_path / name, "\n".join(rows) + "\n")


def test_split_is_a_function_of_seed_and_index_and_holds_every_row_once(tmp_path):
    path = _site(tmp_path, 200)
    one = load_client_csv(path, SCHEMA, test_fraction=0.25, seed=7, index=2)
    again = load_client_csv(path, SCHEMA, test_fraction=0.25, seed=7, index=2)
    other = load_client_csv(path, SCHEMA, test_fraction=0.25, seed=7, index=3)
    np.testing.assert_array_equal(one.test.x, again.test.x)
    assert not np.array_equal(one.test.x, other.test.x)
    everything, _ = read_site_csv(path, SCHEMA)
    joined = np.concatenate([one.train.x, one.test.x])
    assert sorted(map(tuple, joined.tolist())) == sorted(map(tuple, everything.x.tolist()))
    assert len(one.test) == 50
    share = one.test.y.mean(), one.train.y.mean()
    assert abs(share[0] - share[1]) < 0.05  # stratified


def test_too_few_rows_for_a_split(tmp_path):
    path = write(tmp_path / "one.csv", "a,b,y\n1,2,0\n")
    with pytest.raises(SiteDataError, match="too few") as caught:
        load_client_csv(path, SCHEMA, test_fraction=0.2, seed=0, index=0)
    assert caught.value.file == str(path)


def test_chunked_reading_equals_one_chunk(tmp_path, monkeypatch):
    import fedsec.fl_core.csv_data as module

    path = _site(tmp_path, 101)
    whole, _ = read_site_csv(path, SCHEMA)
    monkeypatch.setattr(module, "CHUNK_ROWS", 7)
    chunked, _ = read_site_csv(path, SCHEMA)
    np.testing.assert_array_equal(whole.x, chunked.x)
    np.testing.assert_array_equal(whole.y, chunked.y)
    lines = path.read_text().splitlines()
    lines[51:51] = ["1,2,7", "1,2,7"]  # after 50 data rows, in the eighth chunk
    bad = write(tmp_path / "bad.csv", "\n".join(lines) + "\n")
    with pytest.raises(SiteDataError) as caught:
        read_site_csv(bad, SCHEMA)
    assert caught.value.row == 52 and caught.value.column == "y"


CELL = st.floats(allow_nan=False, allow_infinity=False, min_value=-2.0**100, max_value=2.0**100,
                 width=32)
DEFECTS = ("word", "empty", "nan", "inf", "label", "short", "missing", "extra")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_files_load_exactly_or_fail_at_the_first_defect(tmp_path, data):
    """Random valid tables round-trip exactly; one random defect at a random cell is reported at
    exactly that row and column (for a bad header: row 1 and the column)."""
    n = data.draw(st.integers(1, 30), label="rows")
    order = data.draw(st.permutations(["a", "b", "y"]), label="header order")
    values = data.draw(st.lists(st.tuples(CELL, CELL, st.sampled_from([0, 1])), min_size=n,
                                max_size=n), label="rows")
    table = [[{"a": repr(a), "b": repr(b), "y": str(y)}[c] for c in order] for a, b, y in values]
    header = list(order)
    defect = data.draw(st.sampled_from((None,) + DEFECTS), label="defect")
    row = data.draw(st.integers(0, n - 1), label="row")
    column = data.draw(st.sampled_from(["a", "b"]), label="column")
    at = header.index(column)
    expect: tuple[int | None, str | None] = (row + 2, column)
    if defect in ("word", "empty", "nan", "inf"):
        table[row][at] = {"word": "abc", "empty": "", "nan": "NaN", "inf": "-Infinity"}[defect]
    elif defect == "label":
        table[row][header.index("y")] = "2"
        expect = (row + 2, "y")
    elif defect == "short":
        table[row] = table[row][:-1]
        expect = (row + 2, None)
    elif defect == "missing":
        for line in table:
            del line[at]
        del header[at]
        expect = (1, column)
    elif defect == "extra":
        header.append("z")
        for line in table:
            line.append("1")
        expect = (1, "z")
    path = tmp_path / "random.csv"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([header, *table])
    if defect is None:
        records, features = read_site_csv(path, SCHEMA)
        assert features == ("a", "b")
        np.testing.assert_array_equal(records.x, np.array([v[:2] for v in values], np.float32))
        np.testing.assert_array_equal(records.y, [v[2] for v in values])
        return
    with pytest.raises(SiteDataError) as caught:
        read_site_csv(path, SCHEMA)
    assert (caught.value.row, caught.value.column) == expect
    assert f"row {expect[0]}" in str(caught.value)
