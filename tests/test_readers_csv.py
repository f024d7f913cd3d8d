"""read_ratings of the rating CSVs found in the wild: 3 columns with a header (goodbooks-10k's
``user_id,book_id,rating``), string ids (Amazon reviews' ``A2SUAM1J3GNN3B``, ``0000013714``),
CRLF.  Each file is checked against the ``text`` reader of the same lines (whitespace
separated, header dropped), the reference for ids and ratings."""
import importlib.util
import pathlib
import re

import pytest
import torch

from nnsparse.data import detect_format, read_ratings, read_split

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"

# (id, the csv file's bytes, user_map, item_map, ratings in file order)
READ = [
    ("goodbooks-3-col-header", b"user_id,book_id,rating\n1,258,5\n2,4081,4\n2,260,5\n",
     {1: 0, 2: 1}, {258: 0, 260: 1, 4081: 2}, [5, 4, 5]),
    ("movielens-names-3-col", b"userId,movieId,rating\n1,1,4.0\n1,3,4.5\n6,1,0.5\n",
     {1: 0, 6: 1}, {1: 0, 3: 1}, [4, 4.5, 0.5]),
    ("3-col-no-header", b"1,10,4\n2,10,3.5\n", {1: 0, 2: 1}, {10: 0}, [4, 3.5]),
    ("3-col-crlf", b"user,item,rating\r\n1,10,4\r\n2,10,3.5\r\n", {1: 0, 2: 1}, {10: 0},
     [4, 3.5]),
    ("4-col-crlf", b"userId,movieId,rating,timestamp\r\n1,10,4,0\r\n2,10,3.5,0\r\n",
     {1: 0, 2: 1}, {10: 0}, [4, 3.5]),
    ("3-col-bom-blank-lines", b"\xef\xbb\xbf\nu,i,r\n\n1,10,4\n\n2,10,3.5\n", {1: 0, 2: 1},
     {10: 0}, [4, 3.5]),
    ("header-named-otherwise", b"item,user,score\n1,10,4\n", {1: 0}, {10: 0}, [4]),  # by position
    # Amazon ratings-only files: no header, string users; these items are all integers, so
    # read as ints (leading zeros dropped, as in 'text')
    ("amazon-no-header", b"AH2L9G3DQHHAJ,0000000116,4.0,1019865600\n"
                         b"A2IIIDRK3PRRZY,0000000116,1.0,1395619200\n"
                         b"A1TADCM7YWPQ8M,0000000868,4.0,1031702400\n",
     {"A1TADCM7YWPQ8M": 0, "A2IIIDRK3PRRZY": 1, "AH2L9G3DQHHAJ": 2}, {116: 0, 868: 1},
     [4, 1, 4]),
    # ... an item that is no integer makes every item the file's string: zeros kept
    ("amazon-string-items", b"user,item,rating\nA2SUAM1J3GNN3B,0000013714,5.0\n"
                            b"A2SUAM1J3GNN3B,B00001,4\nA1,0000013714,3\n",
     {"A1": 0, "A2SUAM1J3GNN3B": 1}, {"0000013714": 0, "B00001": 1}, [5, 4, 3]),
    ("mixed-int-and-string-ids", b"user,item,rating\n13,0013,4\nA7,13,3\n7,B1,2\n13,13,1\n",
     {"13": 0, "7": 1, "A7": 2}, {"0013": 0, "13": 1, "B1": 2}, [4, 3, 2, 1]),
    # all integers: ints, and '0013' is 13 (as in 'text', ml-1m and ml-100k)
    ("leading-zero-all-integers", b"u,i,r\n1,0013,4\n2,13,3\n2,14,1\n", {1: 0, 2: 1},
     {13: 0, 14: 1}, [4, 3, 1]),
    ("underscore-ids-are-strings", b"u,i,r\n1_0,a,4\n10,a,3\n", {"10": 0, "1_0": 1}, {"a": 0},
     [4, 3]),
    ("utf8-ids", "u,i,r\njosé,zoë,4\nbob,zoë,2\n".encode(), {"bob": 0, "josé": 1}, {"zoë": 0},
     [4, 2]),
    ("ids-beyond-int64", b"u,i,r\n99999999999999999999,1,4\n2,1,3\n",
     {2: 0, 99999999999999999999: 1}, {1: 0}, [4, 3]),
]


def _text_version(data: bytes) -> bytes:
    """The same ratings as a ``text`` file: the header line dropped, commas made spaces."""
    lines = data.replace(b"\xef\xbb\xbf", b"").splitlines()
    lines = [ln for ln in lines if ln.strip()]
    if not any(c.isdigit() for c in lines[0].split(b",")[2].decode()):  # a header
        lines = lines[1:]
    return b"\n".join(ln.replace(b",", b" ") for ln in lines) + b"\n"


@pytest.mark.parametrize("data, users, items, ratings", [c[1:] for c in READ],
                         ids=[c[0] for c in READ])
def test_csv_files_read(tmp_path, data, users, items, ratings):
    path = tmp_path / "ratings.csv"
    path.write_bytes(data)
    assert detect_format(path) == "csv"
    reference = tmp_path / "ratings.txt"
    reference.write_bytes(_text_version(data))
    text = read_ratings(reference, "text")
    for fmt in ("csv", "auto"):
        r = read_ratings(path, fmt)
        assert r.user_map == users and r.item_map == items, fmt
        assert [type(k) for k in r.user_map] == [type(k) for k in users]
        assert r.rating.tolist() == ratings
        assert r.user_map == text.user_map and r.item_map == text.item_map
        assert torch.equal(r.user, text.user) and torch.equal(r.item, text.item)
        assert torch.equal(r.rating, text.rating)
        assert r.source == str(path) and r.titles is None


# (id, the csv file's bytes, the message after "<file>, " (regex), format)
BAD = [
    ("3-col-header-4-field-line", b"user_id,book_id,rating\n1,2,3\n1,3,4,5\n",
     r"line 3: expected 3 fields, got 4: '1,3,4,5'; the header line has 3 fields$", "csv"),
    ("3-col-2-field-line", b"1,2,3\n1,3\n",
     r"line 2: expected 3 fields, got 2: '1,3'; the first line has 3 fields$", "csv"),
    ("3-col-crlf-2-field-line", b"u,i,r\r\n1,2,3\r\n1,3\r\n",
     r"line 3: expected 3 fields, got 2: '1,3'; the header line has 3 fields$", "csv"),
    # MovieLens ratings.csv's message, as before
    ("4-col-header-3-field-line", b"userId,movieId,rating,timestamp\n1,2,3.5\n",
     r"line 2: expected 4 fields, got 3: '1,2,3\.5'$", "csv"),
    ("3-col-whitespace-line", b"user,item,rating\n1,2,3\n1 3 4\n",
     r"line 3: format 'csv' separates the fields with ',', got '1 3 4'; check format= "
     r"\(one of \['ml-100k', 'ml-1m', 'csv', 'text'\]\)$", "csv"),
    ("string-ids-bad-rating", b"user,item,rating\nA1,B1,4\nA2,B1,x\n",
     r"line 3: the rating must be a finite number, got 'x'$", "csv"),
    # the first line is a rating, its rating bad (it was taken for a header and dropped)
    ("bad-rating-on-the-first-line", b"1,2,x,0\n3,4,5,0\n",
     r"line 1: the rating must be a finite number, got 'x'$", "csv"),
    # a header with a number in it is read as a rating line (it was skipped before 3
    # columns were read); the message says why
    ("header-with-a-number", b"user,item,rating,2020\n1,2,3,0\n",
     r"line 1: the rating must be a finite number, got 'rating'; a first line is a header "
     r"\(skipped\) only when none of its fields is a number$", "csv"),
    ("rating-with-underscore", b"u,i,r\nA,B,1_0\n",
     r"line 2: the rating must be a finite number, got '1_0' \(no '_' in numbers\)$", "csv"),
    ("string-ids-repeated-pair", b"u,i,r\nA,0013,1\nB,13,2\nA,0013,2\nA,B1,3\n",
     r": 1 \(user, item\) pair rated more than once, e\.g\. user 'A' and item '0013' "
     r"\(lines 2, 4\); keep one rating per pair$", "csv"),
    ("non-utf8-id", "u,i,r\nJosé,a,4\n".encode("latin-1"),
     r"line 2: the user id is not UTF-8 text \(unexpected end of data at byte 3 of the "
     r"line\): "
     r"b'Jos\\xe9'; the file must be UTF-8 encoded: re-encode it as UTF-8 \(from latin-1: "
     r"iconv -f latin1 -t utf-8\)$", "csv"),
    ("trailing-comma", b"u,i,r\n1,2,3,\n",
     r"line 2: a line starts or ends with the separator ','", "csv"),
    ("detected-3-col-then-4-fields", b"u,i,r\n1,2,3\n1,3,4,5\n",
     r"line 3: expected 3 fields, got 4: '1,3,4,5'; the header line has 3 fields \(format "
     r"'auto' read ratings\.csv as 'csv', from its first line; give format= to read "
     r"another\)$", "auto"),
    # an extra separator beside an empty field: the tokens around it made the line's
    # fields (read as user 1, item 2, rating 5, silently)
    ("3-col-extra-empty-field", b"u,i,r\nA1,B1,4\n1,,2,5\n",
     r"line 3: expected 3 fields separated by ',', got 4 \(an empty field\): '1,,2,5'$",
     "csv"),
    ("3-col-no-header-extra-empty-field", b"A1,B1,4\nA2,B1, ,3\n",
     r"line 2: expected 3 fields separated by ',', got 4 \(an empty field\): 'A2,B1, ,3'$",
     "csv"),
    ("4-col-extra-empty-field-crlf", b"userId,movieId,rating,timestamp\r\n1,2,3.5,0\r\n"
     b"1,3,,4,0\r\n", r"line 3: expected 4 fields separated by ',', got 5 \(an empty "
     r"field\): '1,3,,4,0' \(format 'auto' read", "auto"),
    # one line with an empty field, another one short of a separator: the file's total
    # count of separators was right
    ("3-col-empty-field-and-whitespace", b"u,i,r\n1,,2,5\n3 4,5\n",
     r"line 2: expected 3 fields separated by ',', got 4 \(an empty field\)", "csv"),
    # quoted fields: the quotes were kept in the ids ('"A1"', a string '"13"')
    ("quoted-ids", b'"user","item","rating"\n"A1","B1",5\n',
     r"line 2: format 'csv' reads fields without quotes, got '\"A1\",\"B1\",5'; save the "
     r"file without quoting", "csv"),
    ("quoted-int-ids-no-header", b'1,2,5\n"13",2,4\n',
     r"line 2: format 'csv' reads fields without quotes, got '\"13\",2,4'", "auto"),
    ("quoted-id-with-comma", b'u,i,r\nA1,B1,4\n"Smith, J",B1,5\n',
     r"line 3: format 'csv' reads fields without quotes, got '\"Smith, J\",B1,5'", "csv"),
    ("two-commas", b"u,i\n1,2\n",
     r"its first line 'u,i' has 2 comma-separated fields, and format 'csv' reads 3 or 4, "
     r"user,item,rating\[,timestamp\] \(MovieLens ratings\.csv: "
     r"userId,movieId,rating,timestamp\); no format reads 2 comma-separated fields", "auto"),
]


@pytest.mark.parametrize("data, message, fmt", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_malformed_csv_files_are_named(tmp_path, data, message, fmt):
    path = tmp_path / "ratings.csv"
    path.write_bytes(data)
    users, items = {"old": 0}, {"old": 0}
    with pytest.raises(ValueError, match=re.escape(str(path)) + r".*?" + message):
        read_ratings(path, fmt, user_map=users, item_map=items)
    assert users == {"old": 0} and items == {"old": 0}  # a failed read changes no map


def test_a_quoted_header_is_skipped(tmp_path):
    """R's write.csv quotes the header's names; the numbers below it are read as ever."""
    path = tmp_path / "ratings.csv"
    path.write_bytes(b'"userId","movieId","rating"\n1,10,4\n2,10,3.5\n')
    r = read_ratings(path)
    assert r.user_map == {1: 0, 2: 1} and r.rating.tolist() == [4, 3.5]


@pytest.mark.parametrize("name, data, fmt, message", [
    ("ratings.dat", b"1::2::5::0\n1::2::::5::0\n", "ml-1m",
     r"line 2: expected 4 fields separated by '::', got 5 \(an empty field\): "
     r"'1::2::::5::0'$"),
    ("u.data", b"1\t2\t5\t0\n\n1\t3\t\t5\t0\n", "ml-100k",
     r"line 3: expected 4 fields separated by '\\t', got 5 \(an empty field\): "
     r"'1\\t3\\t\\t5\\t0'$"),
    # a line one separator short beside one with an extra one (the file's count is right,
    # with no newline at its end): each read as 4 fields
    ("ratings.dat", b"1::2::::5::0\n1::3::4 0", "ml-1m",
     r"line 1: expected 4 fields separated by '::', got 5 \(an empty field\)"),
    ("ratings.dat", b"1::3::4 0\n1::2::::5::0", "ml-1m",
     r"line 1: format 'ml-1m' separates the fields with '::', got '1::3::4 0'; check "
     r"format= \(one of \['ml-100k', 'ml-1m', 'csv', 'text'\]\)$"),
])
def test_an_empty_field_is_refused_in_every_separated_format(tmp_path, name, data, fmt,
                                                             message):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ValueError, match=re.escape(str(path)) + r", " + message):
        read_ratings(path, fmt, titles=False)


@pytest.mark.parametrize("test_text, users, test_users", [
    # string ids in both files: the test file's '13' is the string '13' of the map
    ("u,i,r\n13,B1,2\nZ9,B1,5\n", {"13": 0, "A7": 1, "Z9": 2}, [0, 2]),
    # integer-looking test ids looked up as the map's strings, unseen ones appended
    ("u,i,r\n13,B1,2\n", {"13": 0, "A7": 1}, [0]),
])
def test_read_split_of_string_id_csv_files(tmp_path, test_text, users, test_users):
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    train.write_text("u,i,r\n13,0013,4\nA7,B1,3\n")
    test.write_text(test_text)
    a, b = read_split(train, test)
    assert a.user_map is b.user_map and a.user_map == users
    assert a.item_map == {"0013": 0, "B1": 1}
    assert b.user.tolist() == test_users


def _example():
    spec = importlib.util.spec_from_file_location("movielens_autoencoder",
                                                  EXAMPLES / "movielens_autoencoder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_trains_on_a_3_column_csv_with_string_ids(tmp_path, capsys):
    """``movielens_autoencoder.py --ratings file.csv``: format detected as 'csv', the string
    ids kept, a model trained and scored, recommendations by original id."""
    from nnsparse.data import synthetic_ratings
    r = synthetic_ratings(seed=3, n_users=40, n_items=30, n_ratings=600)
    users = [f"A{u:04X}Z" for u in range(40)]
    items = [f"{i:010d}" if i % 3 else f"B{i:09d}" for i in range(30)]  # zeros that matter
    path = tmp_path / "ratings.csv"
    path.write_text("user_id,item_id,rating\n" + "".join(
        f"{users[u]},{items[i]},{int(x)}\n"
        for u, i, x in zip(r.user.tolist(), r.item.tolist(), r.rating.tolist())))
    result = _example().main(["--ratings", str(path), "--epochs", "2", "--no-refit",
                              "--no-progress", "--hidden", "8", "--recommend", "A0003Z",
                              "-k", "3", "--min-support", "1"])
    out = capsys.readouterr().out
    assert out.startswith(f"600 ratings, {r.n_users} users x {r.n_items} items")
    assert result["args"]["format"] == "csv" and torch.isfinite(
        torch.tensor(result["test_rmse"]))
    top = out.split("top 3 items for user A0003Z:")[1].splitlines()[1:4]
    assert len(top) == 3 and all(line.split()[-1] in items for line in top), top
