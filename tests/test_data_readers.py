"""Tests of nnsparse.data.readers: every format, titles, id maps, errors."""
import dataclasses
import re
import warnings

import pytest
import torch

from nnsparse.data import (FORMATS, Ratings, detect_format, read_item_features,
                           read_ratings, read_split, read_user_features)

# (format, rating file name, its content, title file name, its content (bytes))
FILES = {
    "ml-100k": ("u.data", "196\t242\t3\t881250949\n186\t302\t3\t891717742\n22\t377\t1\t878887116\n"
                "196\t377\t5\t881250950\n",
                "u.item", "242|Kolya (1996)|24-Jan-1997||http://x|0|0\n"
                          "302|L.A. Confidential (1997)|01-Jan-1997||http://y|0|1\n"
                          "377|Heavyweights (1994)|01-Jan-1994||http://z|0|0\n".encode("latin-1")),
    "ml-1m": ("ratings.dat", "1::1193::5::978300760\n1::661::3::978302109\n2::1193::4::978298413\n"
              "3::3408::4::978300275\n",
              "movies.dat", "1193::One Flew Over the Cuckoo's Nest (1975)::Drama\n"
                            "661::James and the Giant Peach (1996)::Animation\n"
                            "3408::Erin Brockovich (2000)::Drama\n".encode("latin-1")),
    "csv": ("ratings.csv", "userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,3,4.5,964981247\n"
            "6,1,0.5,964982224\n6,50,5.0,964982931\n",
            "movies.csv", 'movieId,title,genres\n1,Toy Story (1995),Adventure\n'
                          '3,"Grumpier Old Men, The (1995)",Comedy\n'
                          '50,Usual Suspects (1995),Crime\n'
                          .encode("utf-8")),
    "text": ("ratings.txt", "alice  book1 4\nbob book2 2.5 123\n\nalice book2 1\ncarol book1 3\n",
             None, None),
}


def write(tmp_path, fmt, titles=True):
    name, text, title_name, title_text = FILES[fmt]
    path = tmp_path / name
    path.write_text(text)
    if titles and title_name:
        (tmp_path / title_name).write_bytes(title_text)
    return path


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format(tmp_path, fmt):
    r = read_ratings(write(tmp_path, fmt), format=fmt)
    assert isinstance(r, Ratings) and len(r) == 4
    assert r.user.dtype == r.item.dtype == torch.int64 and r.rating.dtype == torch.float32
    # Ids remapped to 0..n-1 in sorted order, maps invertible.
    assert sorted(r.user_map.values()) == list(range(r.n_users))
    assert sorted(r.item_map.values()) == list(range(r.n_items))
    assert list(r.user_map) == sorted(r.user_map)
    lines = [ln for ln in FILES[fmt][1].splitlines() if ln.strip()][(fmt == "csv"):]
    sep = {"ml-100k": "\t", "ml-1m": "::", "csv": ","}.get(fmt)
    for k, line in enumerate(lines):
        u, i, rating = line.split(sep)[:3]
        if fmt != "text":
            u, i = int(u), int(i)
        assert r.user_ids()[r.user[k]] == u and r.item_ids()[r.item[k]] == i
        assert r.rating[k] == float(rating)


def test_values_ml100k(tmp_path):
    r = read_ratings(write(tmp_path, "ml-100k"), format="ml-100k")
    assert r.user_map == {22: 0, 186: 1, 196: 2}
    assert r.item_map == {242: 0, 302: 1, 377: 2}
    assert r.user.tolist() == [2, 1, 0, 2] and r.item.tolist() == [0, 1, 2, 2]
    assert r.rating.tolist() == [3, 3, 1, 5] and r.scale == (1.0, 5.0)


def test_csv_half_stars_and_text_ids(tmp_path):
    r = read_ratings(write(tmp_path, "csv"), format="csv")
    assert r.rating.tolist() == [4.0, 4.5, 0.5, 5.0] and r.scale == (0.5, 5.0)
    t = read_ratings(write(tmp_path, "text"), format="text")
    assert t.user_map == {"alice": 0, "bob": 1, "carol": 2}
    assert t.item_map == {"book1": 0, "book2": 1}


@pytest.mark.parametrize("fmt, expected", [
    ("ml-100k", ["Kolya (1996)", "L.A. Confidential (1997)", "Heavyweights (1994)"]),
    ("ml-1m", ["James and the Giant Peach (1996)", "One Flew Over the Cuckoo's Nest (1975)",
               "Erin Brockovich (2000)"]),
    ("csv", ["Toy Story (1995)", "Grumpier Old Men, The (1995)", "Usual Suspects (1995)"]),
])
def test_titles(tmp_path, fmt, expected):
    path = write(tmp_path, fmt)
    assert read_ratings(path, format=fmt).titles == expected
    assert read_ratings(path, format=fmt, titles=False).titles is None
    assert read_ratings(path, format=fmt, titles=tmp_path / FILES[fmt][2]).titles == expected


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_side_features_decode_the_item_file_as_the_titles_do(tmp_path, encoding):
    """read_item_features reads a movies.dat as the titles are read: UTF-8 when it is
    (ML-10M's), else latin-1, so a line it refuses is quoted as written (a UTF-8 file's
    'é2' was quoted 'Ã©2')."""
    path = tmp_path / "movies.dat"
    path.write_bytes("1::Misérables, Les (1995)::Drama\n2::Café (2000)::Comedy|Drama\n"
                     .encode(encoding))
    features = read_item_features(path, "ml-1m", {1: 0, 2: 1})
    assert features.tolist() == [[0.0, 1.0], [1.0, 1.0]]  # (Comedy, Drama)
    path.write_bytes("1::Misérables, Les (1995)::Drama\né2::Café (2000)::Comedy\n"
                     .encode(encoding))
    with pytest.raises(ValueError, match=r"movies\.dat, line 2: the item id must be an "
                                         r"integer, got 'é2'$"):
        read_item_features(path, "ml-1m", {1: 0})


def test_titles_latin1_and_missing(tmp_path):
    path = write(tmp_path, "ml-100k", titles=False)
    (tmp_path / "u.item").write_bytes("242|Café Noir (1996)|x\n".encode("latin-1"))
    assert read_ratings(path, format="ml-100k").titles == ["Café Noir (1996)", "item 302",
                                                           "item 377"]
    (tmp_path / "u.item").unlink()
    assert read_ratings(path, format="ml-100k").titles is None
    with pytest.raises(ValueError, match="titles: no item file"):
        read_ratings(path, format="ml-100k", titles=tmp_path / "nope.item")


@pytest.mark.parametrize("fmt, text, line, what", [
    ("ml-100k", "1\t2\t3\t0\n1\t2\t3\n", 2, "expected 4 fields, got 3"),
    ("ml-100k", "1\t2\t3\t0\n\n5\tx\t3\t0\n", 3, "the item id must be an integer, got 'x'"),
    ("ml-100k", "1\t2\t3\t0\n1\t\t3\t0\n", 2, "expected 4 fields, got 3"),
    ("ml-1m", "1::2::3::4\n1::2::3::4::5\n", 2, "expected 4 fields, got 5"),
    # the line quoted as the file holds it (it showed '1 2 3', the separators made spaces)
    ("ml-1m", "1::2::3::4\r\n\n1::2::3\r\n", 3, "expected 4 fields, got 3: '1::2::3'"),
    ("ml-100k", "1\t2\t3\t0\n1\t2\t3\n", 2, "expected 4 fields, got 3: '1\\t2\\t3'"),
    ("csv", "userId,movieId,rating,timestamp\n1,2,3.5\n", 2, "expected 4 fields, got 3: '1,2,3.5'"),
    ("ml-1m", "1::2::3::4\n7::2::three::4\n", 2, "the rating must be a finite number, got 'three'"),
    ("csv", "userId,movieId,rating,timestamp\n1,2,3.5,0\n1,2,nan,0\n", 3,
     "finite number, got 'nan'"),
    ("csv", "userId,movieId,rating,timestamp\n1,2,3.5\n", 2, "expected 4 fields"),
    ("text", "a b 1\nc d\n", 2, "expected 3 to 4 fields, got 2"),
    ("text", "a b 1\nc d 2 3 4\n", 2, "expected 3 to 4 fields, got 5"),
    ("text", "a b 1\nc d 2.5.1\n", 2, "finite number, got '2.5.1'"),
    ("ml-100k", "1.5\t2\t3\t0\n", 1, "the user id must be an integer, got '1.5'"),
    # an id beyond int64 is a valid one: the culprit is the later non-integer
    ("ml-100k", "1\t2\t3\t0\n99999999999999999999\t2\t3\t0\nx\t2\t3\t0\n", 3,
     "the user id must be an integer, got 'x'"),
])
def test_malformed_line(tmp_path, fmt, text, line, what):
    path = tmp_path / "bad_file.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"bad_file\.txt, line {line}: .*{re.escape(what)}"):
        read_ratings(path, format=fmt)


@pytest.mark.parametrize("fmt, sep", [("ml-1m", "::"), ("ml-100k", "\t"), ("csv", ",")])
def test_a_long_malformed_line_is_quoted_cut_and_not_taken_for_its_own_format(tmp_path, fmt,
                                                                           sep):
    """A line of five fields, its fourth 5,000 characters long: quoted whole, then cut to
    200 characters, the cut line held four fields, and the hint said the file's own format
    ("its fields are separated by '::', as in format 'ml-1m': check format=")."""
    head = "userId,movieId,rating,timestamp\n" if fmt == "csv" else ""
    path = tmp_path / "long.dat"
    path.write_bytes((head + sep.join("1234") + "\n" + sep.join(["1", "2", "3", "9" * 5000, "7"])
                      + "\n").encode())
    shown = repr(sep.join(["1", "2", "3", "9" * 5000])[:200])
    length = len(sep.join(["1", "2", "3", "9" * 5000, "7"]))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}, line {2 + bool(head)}: "
                                         rf"expected 4 fields, got 5: {re.escape(shown)} "
                                         rf"\(its first 200 of {length} characters\)$"):
        read_ratings(path, format=fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_empty_file(tmp_path, fmt, text):
    path = tmp_path / "empty.dat"
    path.write_text(text if fmt != "csv" else "userId,movieId,rating,timestamp\n" + text)
    with pytest.raises(ValueError, match=r"empty\.dat holds no ratings"):
        read_ratings(path, format=fmt)


def test_bad_arguments(tmp_path):
    path = write(tmp_path, "text")
    with pytest.raises(ValueError, match="format must be one of .*got 'ml-20m'"):
        read_ratings(path, format="ml-20m")
    with pytest.raises(ValueError, match="unseen must be 'keep' or 'drop', got 'skip'"):
        read_ratings(path, unseen="skip")
    with pytest.raises(ValueError, match="path: no rating file at .*missing.txt"):
        read_ratings(tmp_path / "missing.txt")


def test_crlf_and_trailing_whitespace(tmp_path):
    path = tmp_path / "r.dat"
    path.write_bytes(b"1::10::5::0\r\n2::10::4::0  \r\n")
    r = read_ratings(path, format="ml-1m")
    assert r.rating.tolist() == [5.0, 4.0] and r.item_map == {10: 0}


def split_files(tmp_path):
    train, test = tmp_path / "u1.base", tmp_path / "u1.test"
    train.write_text("1\t10\t4\t0\n2\t20\t5\t0\n3\t10\t2\t0\n")
    # user 9 and item 99 are not in the training file
    test.write_text("3\t20\t3\t0\n9\t10\t1\t0\n2\t99\t4\t0\n1\t20\t2\t0\n")
    (tmp_path / "u.item").write_text("10|Ten|x\n20|Twenty|x\n99|Ninety-nine|x\n")
    return train, test


def test_read_split_shares_maps_and_keeps_unseen(tmp_path):
    train_path, test_path = split_files(tmp_path)
    train, test = read_split(train_path, test_path, format="ml-100k")
    assert train.user_map is test.user_map and train.item_map is test.item_map
    # Training ids keep their indices; unseen test ids come after them.
    assert train.user_map == {1: 0, 2: 1, 3: 2, 9: 3}
    assert train.item_map == {10: 0, 20: 1, 99: 2}
    assert train.user.tolist() == [0, 1, 2] and train.item.tolist() == [0, 1, 0]
    assert test.user.tolist() == [2, 3, 1, 0] and test.item.tolist() == [1, 0, 2, 1]
    assert train.n_users == test.n_users == 4 and train.n_items == test.n_items == 3
    assert train.titles == test.titles == ["Ten", "Twenty", "Ninety-nine"]


def test_read_split_drops_unseen_with_warning(tmp_path):
    train_path, test_path = split_files(tmp_path)
    with pytest.warns(UserWarning, match=r"dropped 2 of 4 ratings"):
        train, test = read_split(train_path, test_path, format="ml-100k", unseen="drop")
    assert train.user_map == {1: 0, 2: 1, 3: 2} and train.item_map == {10: 0, 20: 1}
    assert test.user.tolist() == [2, 0] and test.item.tolist() == [1, 1]
    assert test.rating.tolist() == [3.0, 2.0]


def test_read_split_no_warning_when_all_seen(tmp_path):
    train_path, test_path = split_files(tmp_path)
    test_path.write_text("3\t20\t3\t0\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, test = read_split(train_path, test_path, format="ml-100k", unseen="drop")
    assert len(test) == 1


@pytest.mark.parametrize("test_lines, count, first", [
    ("1\t10\t2\t0\n", "1 (user, item) pair of the test file is", "user 1, item 10"),
    ("3\t10\t1\t0\n2\t20\t5\t0\n1\t10\t2\t0\n9\t99\t2\t0\n",
     "3 (user, item) pairs of the test file are", "user 1, item 10"),
])
def test_read_split_warns_of_pairs_in_both_files(tmp_path, test_lines, count, first):
    train_path, test_path = split_files(tmp_path)
    test_path.write_text(test_lines)
    message = f"{count} rated in the training file too (first: {first})"
    with pytest.warns(UserWarning, match=re.escape(message)) as record:
        train, test = read_split(train_path, test_path, format="ml-100k")
    assert len(record) == 1 and record[0].filename == __file__  # the caller's line
    assert len(test) == len(test_lines.splitlines())  # a warning: nothing is dropped


def test_ratings_record():
    r = Ratings.from_triples(["b", "a", "b"], [3, 1, 1], [1.0, 2.0, 3.0], source="mem")
    assert r.user_map == {"a": 0, "b": 1} and r.user_ids() == ["a", "b"]
    sub = r.subset(torch.tensor([True, False, True]))
    assert sub.user_map is r.user_map and len(sub) == 2 and sub.rating.tolist() == [1.0, 3.0]
    with pytest.raises(ValueError, match="one length, got 2, 3 and 3"):
        Ratings(torch.tensor([0, 1]), torch.tensor([0, 1, 2]), torch.ones(3), {}, {})
    with pytest.raises(TypeError, match="Ratings.user must be a 1-D tensor, got list"):
        Ratings([0], torch.tensor([0]), torch.ones(1), {}, {})
    with pytest.raises(ValueError, match="ratings from mem are empty"):
        r.subset(torch.zeros(3, dtype=torch.bool)).scale


def _record():
    """Users 10, 42; items 7, 9; three ratings, with titles."""
    r = Ratings.from_triples([10, 10, 42], [7, 9, 7], [4., 3., 5.], source="mem")
    return dataclasses.replace(r, titles=["Seven", "Nine"])


_AGREE = r"; to change fields that must agree together, build a new record: dataclasses\.replace\("
# an assignment after construction: (field, value, error, message); the constructor's checks
BAD_ASSIGNMENTS = [
    ("item", torch.tensor([0, 1]), ValueError,
     r"^Ratings\.user, \.item and \.rating must have one length, got 3, 2 and 3" + _AGREE),
    ("item", torch.tensor([0, 1, 2]), ValueError,
     r"^Ratings\.item indices must be in \[0, 2\) \(the size of item_map\), got min 0, max 2"
     + _AGREE),
    ("user", torch.tensor([0, -1, 1]), ValueError,
     r"^Ratings\.user indices must be in \[0, 2\) .*got min -1, max 1" + _AGREE),
    ("item", torch.tensor([0., 1., 0.]), TypeError,
     r"^Ratings\.item must be an int64 tensor of indices, got torch\.float32$"),
    ("item", torch.tensor([0, 1, 0], dtype=torch.int32), TypeError,
     r"^Ratings\.item must be an int64 tensor of indices, got torch\.int32$"),
    ("item", [0, 1, 0], TypeError, r"^Ratings\.item must be a 1-D tensor, got list$"),
    ("rating", torch.tensor([4, 3, 5]), TypeError,
     r"^Ratings\.rating must be a floating-point tensor, got torch\.int64$"),
    ("rating", torch.tensor([4., float("nan"), 5.]), ValueError,
     r"^Ratings\.rating must be finite, got NaN or inf$"),  # (wrong on its own: no hint)
    ("rating", torch.ones(3).to_sparse(), TypeError,
     r"^Ratings\.rating must be a dense 1-D tensor, got layout torch\.sparse_coo$"),
    ("user_map", {10: 0}, ValueError,
     r"^Ratings\.user indices must be in \[0, 1\) \(the size of user_map\), got min 0, max 1"
     + _AGREE),
    # the same length as the map it replaces: checked, not read from the old map's cache
    ("user_map", {10: 1, 42: 1}, ValueError,
     r"^Ratings\.user_map indices must be distinct \(one per id\), got 1 for ids 10 and 42$"),
    ("item_map", [7, 9], TypeError,
     r"^Ratings\.item_map must be a dict of original id -> index, got list$"),
    ("titles", ["a", "b", "c"], ValueError,
     r"^Ratings\.titles must hold at most one title per item of item_map \(2\), got 3"
     + _AGREE),
    ("titles", "Seven", TypeError, r"^Ratings\.titles must be None or a list of str"),
    ("source", 3, TypeError, r"^Ratings\.source must be a str, got int$"),
]


@pytest.mark.parametrize("name, value, error, message", BAD_ASSIGNMENTS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_ASSIGNMENTS)])
def test_a_ratings_field_assigned_is_checked_before_the_record_changes(name, value, error,
                                                                       message):
    r = _record()
    before = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
    user_ids, item_ids = r.user_ids(), r.item_ids()
    with pytest.raises(error, match=message):
        setattr(r, name, value)
    # the record as it was: the same objects, the same answers
    assert all(getattr(r, key) is value for key, value in before.items())
    assert r.user_ids() == user_ids and r.item_ids() == item_ids
    assert torch.equal(r.item, torch.tensor([0, 1, 0]))
    assert dataclasses.replace(r) == r  # still a record the constructor takes


def test_a_ratings_field_assigned_a_valid_value_takes_it():
    r = _record()
    part = r.subset(torch.tensor([True, False, True]))
    r.rating = torch.tensor([4.5, 3., 5.], dtype=torch.float64)
    r.item = torch.tensor([1, 1, 0])
    r.user_map = {"x": 1, "y": 0}  # the same length, other ids: read again
    r.titles, r.source = None, "edited"
    assert r.rating.dtype == torch.float64 and r.item.tolist() == [1, 1, 0]
    assert r.user_ids() == ["y", "x"] and r.titles is None and r.source == "edited"
    assert part.user_ids() == [10, 42]  # the subset sharing the ids cache still reads its own
    r.user_map = part.user_map
    assert r.user_ids() == [10, 42]
    # a tensor subclass is stored as a plain tensor, as the constructor stores it
    class Sub(torch.Tensor):
        pass
    r.rating = torch.tensor([1., 2., 3.]).as_subclass(Sub)
    assert type(r.rating) is torch.Tensor


def test_a_ratings_pair_check_follows_an_assigned_tensor():
    # the (user, item) pairs known unique are forgotten when user or item is replaced
    from nnsparse.data import split_ratings
    r = _record()
    r._mark_unique()
    assert r._known_unique()
    r.item = torch.tensor([0, 0, 0])  # (10, 7) twice now
    assert not r._known_unique()
    with pytest.raises(ValueError, match=r"pair rated more than once, e\.g\. user 10 and item 7"):
        split_ratings(r, 0.5, seed=0)


def test_ratings_fields_cannot_be_deleted_and_replace_changes_several():
    r = _record()
    with pytest.raises(AttributeError, match=r"^Ratings\.item cannot be deleted .*"
                       r"dataclasses\.replace\(ratings, item=\.\.\.\)$"):
        del r.item
    assert torch.equal(r.item, torch.tensor([0, 1, 0]))
    # fields that must agree, changed together: a new record
    two = dataclasses.replace(r, user=torch.tensor([0, 0]), item=torch.tensor([0, 1]),
                              rating=torch.tensor([1., 2.]), user_map={10: 0})
    assert len(two) == 2 and two.n_users == 1 and len(r) == 3
    with pytest.raises(ValueError, match=r"^Ratings\.user_map indices must be distinct"):
        dataclasses.replace(r, user_map={10: 1, 42: 1})  # not the old map's cached ids


def test_ratings_repr_is_a_summary_not_the_maps(tmp_path):
    """print(ratings) once printed every id of both maps and every title (ML-1M: about
    10,000 map entries and 3,700 titles), and a Split's parts three times over."""
    from nnsparse.data import split_ratings, synthetic_ratings

    r = read_ratings(write(tmp_path, "ml-100k"), format="ml-100k")
    assert repr(r) == (f"Ratings(ratings=4, n_users=3, n_items=3, dtype=torch.float32, "
                       f"titles=<3 titles>, source={r.source!r})")
    big = synthetic_ratings(0)  # 943 users, 1,682 items, 100,000 ratings
    assert len(repr(big)) < 200 and "user_map" not in repr(big)
    split = split_ratings(big, 0.2, seed=0)
    assert "Ratings(ratings=80000, n_users=943, n_items=1682," in repr(split)
    assert len(repr(split)) < 600
    m = Ratings.from_triples([1], [2], [3.0])
    assert repr(m) == ("Ratings(ratings=1, n_users=1, n_items=1, dtype=torch.float32, "
                       "titles=None, source='')")
    # a field that is not a tensor (an assignment is refused: set past the check, as a
    # __post_init__ that refused its fields leaves one): the repr still does not raise
    object.__setattr__(m, "rating", [3.0])
    assert repr(m) == "<Ratings with unchecked fields>"


def test_utf8_and_huge_ids_in_text(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text("josé zoë 4\nmaría zoë 3\n", encoding="utf-8")
    r = read_ratings(path, "text")
    assert r.user_map == {"josé": 0, "maría": 1} and r.item_map == {"zoë": 0}
    path.write_text("12345678901234567890 5 4\n98765432109876543210 5 3\n")
    for fmt, text in (("text", None), ("ml-100k", "12345678901234567890\t5\t4\t0\n1\t5\t3\t0\n")):
        if text:
            path.write_text(text)
        r = read_ratings(path, fmt)
        assert 12345678901234567890 in r.user_map and len(r) == 2


def test_undecodable_files_are_named(tmp_path):
    path = tmp_path / "r.txt"
    path.write_bytes("jos\xe9 a 4\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"r\.txt, line 1: the user id is not UTF-8 text"):
        read_ratings(path, "text")
    ratings = tmp_path / "ratings.csv"
    ratings.write_text("userId,movieId,rating,timestamp\n1,2,3.5,0\n")
    (tmp_path / "movies.csv").write_bytes("movieId,title\n2,Caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"titles: .*movies\.csv, line 2: expected UTF-8 text"):
        read_ratings(ratings, "csv")


# Every public reader on a latin-1 file (MovieLens-100K's u.item and -1M's movies.dat are
# latin-1): each reads it as latin-1 where its format is, or refuses it by name.  A latin-1
# movies.csv raised the codec's UnicodeDecodeError from read_item_features (no path, no
# line; its offset counted from a read chunk), and its titles named no line.
_CAFE = "Caf\u00e9 (1995)".encode("latin-1")
_FLAGS = b"|".join([b"0"] * 18 + [b"1"])
_NOT_UTF8 = (r"expected UTF-8 text \(MovieLens movies\.csv is UTF-8\), got the byte b'\\xe9' "
             r"\(invalid continuation byte, byte {byte} of the file\) in '{line}'; re-encode "
             r"it as UTF-8 \(from latin-1: iconv -f latin1 -t utf-8\)")
_MOVIES_CSV = b"movieId,title,genres\n1," + _CAFE + b",Drama\n"
_LONG_CSV = (b"movieId,title,genres\n" + b"".join(b"%d,A,Comedy\n" % i for i in range(2, 900))
             + b"1," + _CAFE + b",Drama\n")


def _write(tmp_path, files):
    """``files`` (name -> bytes) written into ``tmp_path``: name -> path."""
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return {name: tmp_path / name for name in files}


def _titles(files, fmt):
    """A call reading the titles of the rating file among ``files`` (the directory's)."""
    return lambda p: (_write(p, files), read_ratings(p, fmt).titles)[1]


_LATIN1 = [
    # (id, call on tmp_path, error (None: it reads), regex or expected result)
    ("item-ml-100k", lambda p: read_item_features(_write(p, {
        "u.item": b"1|" + _CAFE + b"|01-Jan-1995||http://x|" + _FLAGS + b"\n"})["u.item"],
        "ml-100k", {1: 0}).tolist(), None, [[0.0] * 18 + [1.0]]),
    ("item-ml-1m", lambda p: read_item_features(_write(p, {
        "movies.dat": b"1::" + _CAFE + b"::Drama\n"})["movies.dat"], "ml-1m", {1: 0}).tolist(),
     None, [[1.0]]),
    ("user-ml-100k", lambda p: read_user_features(_write(p, {
        "u.user": b"1|24|M|t\xe9cnico|85711\n"})["u.user"], "ml-100k", {1: 0})[0, -1].item(),
     None, 1.0),
    ("user-ml-1m", lambda p: read_user_features(_write(p, {
        "users.dat": b"1::F::1::10::4\xe9\n"})["users.dat"], "ml-1m", {1: 0})[0, 0].item(),
     None, 1.0),
    ("titles-ml-100k", _titles({"u.data": b"1\t1\t4\t0\n", "u.item": b"1|" + _CAFE + b"|d||u|"
                                + _FLAGS + b"\n"}, "ml-100k"), None, ["Caf\u00e9 (1995)"]),
    ("titles-ml-1m", _titles({"ratings.dat": b"1::1::4::0\n",
                              "movies.dat": b"1::" + _CAFE + b"::Drama\n"}, "ml-1m"),
     None, ["Caf\u00e9 (1995)"]),
    ("detect-format", lambda p: detect_format(_write(p, {"r.txt": b"jos\xe9 a 4\n"})["r.txt"]),
     None, "text"),
    # a latin-1 movies.csv: refused by name (MovieLens movies.csv is UTF-8), with its line
    ("item-csv", lambda p: read_item_features(_write(p, {"movies.csv": _MOVIES_CSV})
                                              ["movies.csv"], "csv", {1: 0}),
     ValueError, r"^path: .*movies\.csv, line 2: " + _NOT_UTF8.format(
         byte=_MOVIES_CSV.index(b"\xe9"), line="1,Caf\u00e9 \\(1995\\),Drama") + "$"),
    ("item-csv-past-a-chunk", lambda p: read_item_features(_write(p, {"movies.csv": _LONG_CSV})
                                                           ["movies.csv"], "csv", {1: 0}),
     ValueError, r"^path: .*movies\.csv, line 900: " + _NOT_UTF8.format(
         byte=_LONG_CSV.index(b"\xe9"), line="1,Caf\u00e9 \\(1995\\),Drama")),
    ("titles-csv", _titles({"ratings.csv": b"1,1,4\n", "movies.csv": _MOVIES_CSV}, "csv"),
     ValueError, r"^titles: .*movies\.csv, line 2: " + _NOT_UTF8.format(
         byte=_MOVIES_CSV.index(b"\xe9"), line="1,Caf\u00e9 \\(1995\\),Drama")
     + ", or pass titles=False$"),
    # latin-1 string ids: refused by name, with the same advice
    ("ratings-text", lambda p: read_ratings(_write(p, {"r.txt": b"jos\xe9 a 4\n"})["r.txt"]),
     ValueError, r"r\.txt, line 1: the user id is not UTF-8 text \(unexpected end of data at "
                 r"byte 3 of the line\): b'jos\\xe9'; the file must be UTF-8 encoded: "
                 r"re-encode it as UTF-8 \(from latin-1: iconv -f latin1 -t utf-8\)"),
    ("ratings-csv", lambda p: read_ratings(_write(p, {"r.csv": b"u,i,r\nb,jos\xe9,4\n"})["r.csv"],
                                           "csv"),
     ValueError, r"r\.csv, line 2: the item id is not UTF-8 text .*; the file must be UTF-8 "
                 r"encoded: re-encode it as UTF-8 \(from latin-1: iconv -f latin1 -t utf-8\)$"),
    ("read-split", lambda p: read_split(*(lambda d: (d["a.txt"], d["b.txt"]))(_write(p, {
        "a.txt": b"a b 4\n", "b.txt": b"jos\xe9 b 4\n"}))),
     ValueError, r"b\.txt, line 1: the user id is not UTF-8 text .*iconv -f latin1 -t utf-8"),
    # ids of the MovieLens formats are integers: the latin-1 byte quoted as latin-1
    ("ratings-ml-1m", lambda p: read_ratings(_write(p, {"r.dat": b"1::1\xe9::4::0\n"})["r.dat"],
                                             "ml-1m"),
     ValueError, r"r\.dat, line 1: the item id must be an integer, got '1\u00e9'$"),
]


@pytest.mark.parametrize("case", _LATIN1, ids=[c[0] for c in _LATIN1])
def test_every_reader_on_a_latin1_file(tmp_path, case):
    _, call, error, expected = case
    if error is None:
        assert call(tmp_path) == expected
        return
    with pytest.raises(error, match=expected):
        call(tmp_path)


def test_wrong_format_is_detected(tmp_path):
    path = tmp_path / "ratings.csv"
    path.write_text("1,2,3.5,0\n4,5,1,0\n")  # no header: the first line is a rating
    r = read_ratings(path, "csv")
    assert len(r) == 2 and r.rating.tolist() == [3.5, 1.0]
    path.write_text("1 2 3 0\n4 5 1 0\n")
    for fmt, sep in (("ml-1m", "'::'"), ("csv", "','"), ("ml-100k", r"'\\t'")):
        with pytest.raises(ValueError, match=rf"line 1: format '{fmt}' separates the fields "
                                             rf"with {sep}"):
            read_ratings(path, fmt)


def test_missing_file_and_directory_differ(tmp_path):
    with pytest.raises(ValueError, match="no rating file at .*nothing.dat .it does not exist"):
        read_ratings(tmp_path / "nothing.dat", "ml-1m")
    with pytest.raises(ValueError, match="is a directory; give the rating file in it"):
        read_ratings(tmp_path, "ml-1m")


@pytest.mark.parametrize("kwargs, text, message", [
    ({"titles": "missing.dat"}, "3\t30\t4\t0\n", "titles: no item file"),
    ({}, "3\t30\t4\t0\n3\t31\tx\t0\n", "the rating must be a finite number"),
    ({}, "3\t30\t4\t0\n3\t31\n", "expected 4 fields"),
])
def test_failed_read_leaves_the_given_maps_unchanged(tmp_path, kwargs, text, message):
    path = tmp_path / "u.test"
    path.write_text(text)
    users, items = {1: 0, 2: 1}, {10: 0}
    with pytest.raises(ValueError, match=message):
        read_ratings(path, "ml-100k", user_map=users, item_map=items, **kwargs)
    assert users == {1: 0, 2: 1} and items == {10: 0}
    path.write_text("3\t30\t4\t0\n")
    read_ratings(path, "ml-100k", user_map=users, item_map=items)
    assert users == {1: 0, 2: 1, 3: 2} and items == {10: 0, 30: 1}


@pytest.mark.parametrize("fmt, text, example", [
    ("ml-100k", "1\t10\t4\t0\n2\t10\t3\t0\n1\t10\t5\t0\n", "user 1 and item 10 (lines 1, 3)"),
    ("ml-1m", "1::10::4::0\n\n1::10::5::0\n1::10::2::0\n2::20::1::0\n2::20::1::0\n",
     "user 1 and item 10 (lines 1, 3, 4)"),
    ("csv", "userId,movieId,rating,timestamp\n1,10,4,0\n2,5,1,0\n2,5,2,0\n",
     "user 2 and item 5 (lines 3, 4)"),
    ("text", "bob book 4\nann book 2\nbob book 1 7\n", "user 'bob' and item 'book' (lines 1, 3)"),
])
def test_a_pair_rated_twice_is_refused_with_its_lines(tmp_path, fmt, text, example):
    # Real MovieLens files rate each pair once; a repeat would leak across a split.
    path = tmp_path / "twice.dat"
    path.write_text(text)
    pairs = 2 if fmt == "ml-1m" else 1
    users, items = {1: 0}, {10: 0}
    maps = dict(user_map=users, item_map=items) if fmt == "ml-100k" else {}
    with pytest.raises(ValueError) as info:
        read_ratings(path, fmt, **maps)
    assert str(info.value) == (f"{path}: {pairs} (user, item) pair{'s' * (pairs > 1)} rated more "
                               f"than once, e.g. {example}; keep one rating per pair")
    assert users == {1: 0} and items == {10: 0}  # the refused read changed no map


def test_a_read_record_is_known_unique(tmp_path, monkeypatch):
    # the reader checked the file's pairs: a split of the record does not sort them again
    from nnsparse.data import readers, split_ratings
    path = tmp_path / "once.dat"
    path.write_text("1::10::4::0\n2::10::1::0\n2::11::2::0\n3::11::5::0\n")
    r = read_ratings(path, "ml-1m")
    assert r._known_unique()
    calls = []
    monkeypatch.setattr(readers, "_sorted_pair_keys", lambda *parts: calls.append(parts))
    rest, part = split_ratings(r, 0.5, seed=0)
    assert calls == [] and rest._known_unique() and part._known_unique()
    r.user[0] = 1  # an edit in place forgets it
    assert not r._known_unique()


@pytest.mark.parametrize("edit", ["user", "item"])
def test_an_inference_record_is_never_known_unique(edit):
    # an inference tensor (torch.inference_mode) has no version counter: an edit in place
    # inside inference mode cannot be seen, so its record is checked at every call
    from nnsparse.data.readers import _check_unique_pairs
    with torch.inference_mode():
        r = Ratings.from_triples([1, 2, 2], [10, 10, 20], [3.0, 4.0, 5.0])
        _check_unique_pairs("r", r)
        assert not r._known_unique()
        if edit == "user":
            r.user[0] = 1  # user 2 rates item 10 twice
        else:
            r.item[2] = 0
        with pytest.raises(ValueError, match=r"^r: 1 \(user, item\) pair rated more than once, "
                                             r"e\.g\. user 2 and item 10 \(2 ratings\)"):
            _check_unique_pairs("r", r)


def test_repeated_pair_lines_after_dropping_unseen(tmp_path):
    path = tmp_path / "u.test"
    path.write_text("9\t10\t1\t0\n1\t10\t4\t0\n1\t10\t5\t0\n")  # user 9 is dropped
    with pytest.warns(UserWarning, match="dropped 1"), pytest.raises(
            ValueError, match=r"e\.g\. user 1 and item 10 \(lines 2, 3\)"):
        read_ratings(path, "ml-100k", user_map={1: 0}, item_map={10: 0}, unseen="drop")


@pytest.mark.parametrize("fmt, text", [
    ("csv", "1,2,3.5,0\n2,3,4,0\n"),                                # no header
    ("csv", "userId,movieId,rating,timestamp\n1,2,3.5,0\n2,3,4,0\n"),
    ("ml-1m", "1::2::3.5::0\n2::3::4::0\n"),
    ("ml-100k", "1\t2\t3.5\t0\n2\t3\t4\t0\n"),
    ("text", "1 2 3.5\n2 3 4\n"),
])
def test_a_utf8_byte_order_mark_is_skipped(tmp_path, fmt, text):
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    r = read_ratings(path, fmt)
    assert r.rating.tolist() == [3.5, 4.0]
    assert r.user_map == {1: 0, 2: 1} and r.item_map == {2: 0, 3: 1}


@pytest.mark.parametrize("fmt, title_name, text", [
    ("ml-1m", "movies.dat", "1193::Cuckoo's Nest (1975)::Drama\n"),
    ("csv", "movies.csv", "movieId,title,genres\n1,Toy Story (1995),Adventure\n"),
])
def test_a_byte_order_mark_in_the_title_file_is_skipped(tmp_path, fmt, title_name, text):
    path = write(tmp_path, fmt, titles=False)
    (tmp_path / title_name).write_bytes(b"\xef\xbb\xbf" + text.encode())
    title = text.splitlines()[-1].split("::" if fmt == "ml-1m" else ",")[1]
    assert title in read_ratings(path, fmt).titles


@pytest.mark.parametrize("fmt, text, line, what", [
    ("ml-1m", "10::10::2::0\n1_0::10::1::0\n", 2, "the user id must be an integer, got '1_0'"),
    ("ml-100k", "1\t1_0\t1\t0\n", 1, "the item id must be an integer, got '1_0'"),
    ("csv", "userId,movieId,rating,timestamp\n1,2,3,0\n1,3,1_0,0\n", 3,
     "the rating must be a finite number, got '1_0'"),
    ("text", "a b 1\nc d 4_0.5\n", 2, "the rating must be a finite number, got '4_0.5'"),
    ("ml-1m", "12_345_678_901_234_567_890::1::1::0\n", 1,
     "the user id must be an integer, got '12_345_678_901_234_567_890'"),
])
def test_numbers_with_underscores_are_refused(tmp_path, fmt, text, line, what):
    # Python and numpy read 1_0 as 10 (PEP 515): 1_0 and 10 would be one user
    path = tmp_path / "under.dat"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"under\.dat, line {line}: {re.escape(what)} "
                                         rf"\(no '_' in numbers\)"):
        read_ratings(path, fmt)


def test_underscores_in_text_ids_keep_them_strings(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text("1_0 a 4\n10 a 3\n")  # not the integer 10 twice: two users
    assert read_ratings(path, "text").user_map == {"10": 0, "1_0": 1}
    path.write_text("1_0 a 4\n10 a 3\nuser_7 b 2\n")
    assert read_ratings(path, "text").user_map == {"10": 0, "1_0": 1, "user_7": 2}
    for fmt, text in (("text", "+1 01 4\n2 1 3\n"), ("ml-1m", "+1::01::4::0\n2::1::3::0\n")):
        path.write_text(text)  # signs and leading zeros are read as before
        r = read_ratings(path, fmt)
        assert r.user_map == {1: 0, 2: 1} and r.item_map == {1: 0}


@pytest.mark.parametrize("token", ["1e39", "-4e38"])
def test_a_rating_beyond_float32_is_named(tmp_path, token):
    path = tmp_path / "big.dat"
    path.write_text(f"1::10::5::0\n2::10::{token}::0\n")
    with pytest.raises(ValueError, match=rf"big\.dat, line 2: the rating '{token}' overflows "
                                         r"the rating dtype float32 \(at most 3\.403e\+38"):
        read_ratings(path, "ml-1m")


@pytest.mark.parametrize("user, error, match", [
    ([None, 1], ValueError, r"user must hold ids, got None \(a missing id\) at position 0"),
    ([1, None], ValueError, r"user must hold ids, got None \(a missing id\) at position 1"),
    ([float("nan"), float("nan")], ValueError, r"user must hold ids, got nan \(a missing id\)"),
    (["a", float("nan")], ValueError, r"user must hold ids, got nan \(a missing id\) at position 1"),
    (torch.tensor([1.0, float("nan")]), ValueError, r"user must hold ids, got nan"),
])
def test_from_triples_refuses_missing_ids(user, error, match):
    with pytest.raises(error, match=match):
        Ratings.from_triples(user, [1, 2], [1.0, 2.0])
    with pytest.raises(error, match=match.replace("user", "item", 1)):
        Ratings.from_triples([1, 2], user, [1.0, 2.0])


def test_from_triples_rating_beyond_float32():
    with pytest.raises(ValueError, match=r"rating must fit the rating dtype float32 \(at most "
                                         r"3\.403e\+38 in size\), got 1e\+39 at position 1"):
        Ratings.from_triples([1, 2], [1, 2], [1.0, 1e39])


def _index_cases():
    import numpy as np
    return [
        ("uint8-tensor", torch.tensor([1, 1, 0, 0], dtype=torch.uint8), TypeError,
         r"index must be int64 indices or a bool mask, got torch\.uint8, which torch would read "
         r"as a mask; convert it with \.long\(\) \(indices\) or \.bool\(\) \(a mask\)"),
        ("uint8-numpy", np.array([1, 1, 0, 0], dtype=np.uint8), TypeError,
         r"index must be int64 indices or a bool mask, got torch\.uint8"),
        ("past-the-end", torch.tensor([7]), IndexError,
         r"index must be in \[-4, 4\) \(entries of 4 ratings\), got 7"),
        ("before-the-start", [0, -5], IndexError, r"index must be in \[-4, 4\) .*got -5"),
        ("float", torch.tensor([1.0]), TypeError, r"index must be an integer or bool tensor"),
        # uint64 beyond int64: .long() wrapped 2**64 - 1 to -1, which took the last entry
        ("uint64-max-tensor", torch.tensor([2 ** 64 - 1], dtype=torch.uint64), IndexError,
         r"^index must be in \[-4, 4\) \(entries of 4 ratings\), got 18446744073709551615$"),
        ("uint64-max-numpy", np.array([0, 2 ** 64 - 1], dtype=np.uint64), IndexError,
         r"^index must be in \[-4, 4\) \(entries of 4 ratings\), got 18446744073709551615$"),
        ("uint64-2**63", torch.tensor([1, 2 ** 63], dtype=torch.uint64), IndexError,
         r"^index must be in \[-4, 4\) \(entries of 4 ratings\), got 9223372036854775808$"),
        # a bytearray's bytes were read as indices (bytes, str and rows= refused it)
        ("bytearray", bytearray(b"\x03\x00\x03"), TypeError,
         r"^index must be an integer or bool tensor, got bytearray$"),
        ("bytes", b"\x03\x00", TypeError, r"^index must be an integer or bool tensor, got bytes$"),
        # an int of a list beyond int64 is out of range, not a wrong kind (was "got list")
        ("list-int-2**64", [0, 2 ** 64], IndexError,
         r"^index must be in \[-4, 4\) \(entries of 4 ratings\), got 18446744073709551616$"),
        ("list-int-below-int64", [-2 ** 63 - 1], IndexError,
         r"^index must be in \[-4, 4\) \(entries of 4 ratings\), got -9223372036854775809$"),
        ("list-np-uint64-max", [np.uint64(2 ** 64 - 1), 1], IndexError,
         r"^index must be in \[-4, 4\) \(entries of 4 ratings\), got 18446744073709551615$"),
        ("list-of-str", [1, "a"], TypeError, r"^index must be an integer or bool tensor, got list$"),
    ]


@pytest.mark.parametrize("case", _index_cases(), ids=lambda c: c[0])
def test_subset_refuses_bad_indices(case):
    _, index, error, match = case
    r = Ratings.from_triples([1, 2, 3, 4], [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(error, match=match):
        r.subset(index)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64])
def test_subset_reads_every_signed_index_dtype_as_indices(dtype):
    r = Ratings.from_triples([1, 2, 3, 4], [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])
    assert r.subset(torch.tensor([1, 1, -1], dtype=dtype)).rating.tolist() == [2.0, 2.0, 4.0]


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_subset_reads_unsigned_indices_in_range(dtype):
    r = Ratings.from_triples([1, 2, 3, 4], [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])
    assert r.subset(torch.tensor([3, 0, 3], dtype=dtype)).rating.tolist() == [4.0, 1.0, 4.0]


@pytest.mark.parametrize("make, expected", [
    (lambda np: np.flip(np.array([0, 2, 3])), [4.0, 3.0, 1.0]),
    (lambda np: np.arange(4)[::-2], [4.0, 2.0]),
    (lambda np: np.flip(np.array([True, False, False, True])), [1.0, 4.0]),
    (lambda np: np.flip(np.array([[0, 1], [2, 3]]))[0], [4.0, 3.0]),
], ids=["flip", "negative-step", "flipped-mask", "flipped-2d-row"])
def test_subset_takes_numpy_indices_with_negative_strides(make, expected):
    # torch.as_tensor refuses them: "index must be an integer or bool tensor, got ndarray",
    # though numpy arrays with positive strides were taken (probe 18)
    import numpy as np
    r = Ratings.from_triples([1, 2, 3, 4], [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])
    assert r.subset(make(np)).rating.tolist() == expected


def _pairs_reference(ratings, other):
    """rated_in's dense reference: each rating's (user id, item id) pair looked up among
    ``other``'s pairs of ids."""
    theirs = set(zip((other.user_ids()[u] for u in other.user.tolist()),
                     (other.item_ids()[i] for i in other.item.tolist())))
    return [(ratings.user_ids()[u], ratings.item_ids()[i]) in theirs
            for u, i in zip(ratings.user.tolist(), ratings.item.tolist())]


def test_rated_in_marks_the_pairs_the_other_record_rates(tmp_path):
    """The test pairs that training rates too (the example and bench_models left them out of
    the ranking, each writing the mask): against a set of id pairs, for read_split's parts
    (the test file adds an item: keys over the wider map), a split, and empty records."""
    from nnsparse.data import split_ratings, synthetic_ratings
    train_file, test_file = tmp_path / "u1.base", tmp_path / "u1.test"
    train_file.write_text("1\t10\t4\t0\n1\t20\t3\t0\n2\t10\t5\t0\n")
    test_file.write_text("1\t20\t2\t0\n2\t20\t1\t0\n2\t30\t4\t0\n1\t10\t1\t0\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (read_split warns of the shared pairs)
        train, test = read_split(train_file, test_file, "ml-100k")
    assert test.rated_in(train).tolist() == [True, False, False, True]
    assert train.rated_in(test).tolist() == [True, True, False]
    assert test.rated_in(train).tolist() == _pairs_reference(test, train)
    whole = synthetic_ratings(0, 30, 20, 250)
    part, rest = split_ratings(whole, 0.3, seed=0)
    assert not rest.rated_in(part).any() and part.rated_in(whole).all()
    assert rest.rated_in(whole).tolist() == _pairs_reference(rest, whole)
    assert whole.rated_in(part).tolist() == _pairs_reference(whole, part)
    empty = whole.subset([])
    assert whole.rated_in(empty).tolist() == [False] * len(whole)
    assert empty.rated_in(whole).dtype == torch.bool and len(empty.rated_in(whole)) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="mixed devices need a CUDA device")
def test_rated_in_keeps_the_device_and_refuses_another():
    """The mask is on the ratings' device; ``other`` on another device is refused, naming
    both (torch.isin's error named neither argument)."""
    from nnsparse.data import split_ratings, synthetic_ratings
    train, test = split_ratings(synthetic_ratings(0, 30, 20, 250), 0.3, seed=0)
    on = lambda r: Ratings(r.user.cuda(), r.item.cuda(), r.rating.cuda(), r.user_map,
                           r.item_map)
    mask = on(train).rated_in(on(test))
    assert mask.device.type == "cuda" and torch.equal(mask.cpu(), train.rated_in(test))
    with pytest.raises(ValueError, match=r"^other must be on this record's device cuda:0, "
                                         r"got cpu$"):
        on(train).rated_in(test)


@pytest.mark.parametrize("other, error, match", [
    (None, TypeError, r"^other must be a Ratings record \(from read_ratings or "
     r"Ratings.from_triples\), got NoneType$"),
    ("ratings", TypeError, r"^other must be a Ratings record \(from read_ratings or "
     r"Ratings.from_triples\), got str$"),
    (Ratings.from_triples([1, 2], [7, 9], [4.0, 3.0]), ValueError,
     r"^other must index users as in this record \(user 2 is user 0 there, 1 here\); read "
     r"both with read_split or split them from one Ratings$"),
])
def test_rated_in_refuses_another_kind_or_other_ids(other, error, match):
    r = Ratings.from_triples([1, 2], [7, 9], [4.0, 3.0]).subset([1])
    # user 2 at index 0: 1 in other
    r = dataclasses.replace(r, user_map={2: 0}, user=torch.tensor([0]))
    with pytest.raises(error, match=match):
        r.rated_in(other)


@pytest.mark.parametrize("ratings, movies, titles", [
    # a csv file of string ids (read since session 20) next to its movies.csv: the item
    # file's ids were read as integers only ("the item id must be an integer, got 'B001'")
    ("u1,B001,5\nu2,B002,3\nu1,B002,4\n",
     "movieId,title,genres\nB001,Book one,x|y\nB002,Book two,y\n", ["Book one", "Book two"]),
    # one id no integer: every item id a string, "1" movies.csv's 1 (was 'item 1'); "1_0"
    # no integer (int() reads 10)
    ("u1,1,5\nu2,2,3\nu1,1_0,4\nu2,10,4\n",
     "movieId,title,genres\n1,One,x\n2,Two,y\n10,Ten,x\n",
     ["One", "Ten", "item 1_0", "Two"]),
])
def test_csv_string_ids_meet_their_item_file(tmp_path, ratings, movies, titles):
    (tmp_path / "ratings.csv").write_text(ratings)
    (tmp_path / "movies.csv").write_text(movies)
    r = read_ratings(tmp_path / "ratings.csv", "csv")
    assert [r.titles[r.item_map[k]] for k in sorted(r.item_map, key=str)] == titles
    features = read_item_features(tmp_path / "movies.csv", "csv", r.item_map)
    genres = {"x": 0, "y": 1}
    for line in movies.splitlines()[1:]:
        item, _, names = line.split(",")
        expected = torch.zeros(2)
        expected[[genres[g] for g in names.split("|")]] = 1
        key = item if item in r.item_map else int(item)
        assert torch.equal(features[r.item_map[key]], expected)
    if "1_0" in r.item_map:  # no line of its own: no genre
        assert not features[r.item_map["1_0"]].any()


# -- the tokens as offsets into the bytes (no Python object per token) -------------------

@pytest.mark.parametrize("raw", [
    b"1 2 3 4\n5 6 7 8\n",
    b"1 2 3 4\n5 6 7 8",                          # a last token at the end of the bytes
    b"  12345678901234567890 x\t\tyy  \r\n\n z",  # runs of whitespace, \r, a wide token
    b"\xe9t\xe9 caf\xc3\xa9 1",                   # latin-1 and UTF-8 bytes
    b"x",
], ids=["lines", "no-final-newline", "whitespace-wide", "non-ascii", "one"])
@pytest.mark.parametrize("chunk", [1, 2, 1 << 16])
def test_tokens_are_raw_split(monkeypatch, raw, chunk):
    """_Tokens gives raw.split()'s tokens one by one and picked as an array, whatever the
    chunk of its gather (a file holding a NUL, which a bytes array would drop, is refused
    before it is tokenised: tests/test_bad_inputs_probe20.py)."""
    from nnsparse.data.readers import _Tokens, _tokenise
    import numpy as np
    monkeypatch.setattr(_Tokens, "_CHUNK", chunk)
    tokens = _tokenise(raw, "f", (1, 10 ** 6), False)[0]
    expected = raw.split()
    assert len(tokens) == len(expected) and [tokens[k] for k in range(len(tokens))] == expected
    for index in (np.arange(len(expected)), np.arange(len(expected))[::-1],
                  np.array([0, 0], dtype=np.int64), np.zeros(0, dtype=np.int64)):
        picked = tokens.pick(index)
        assert picked.dtype.kind == "S" and picked.tolist() == [expected[k] for k in index.tolist()]


def test_tokens_gather_a_long_token_in_bounded_memory():
    """A long token (a 5000-byte id) gathers fewer tokens at a time: the temporaries stay
    near the picked array's own size (its index temporary was 8 bytes a picked byte, 1.8 GB
    for a 20000-line file of 230 KB), and the tokens are raw.split()'s."""
    import tracemalloc
    from nnsparse.data.readers import _Tokens, _tokenise
    import numpy as np
    lines = [b"%d %d 4" % (u, u % 7) for u in range(1000)]
    lines[5] = b"A" + b"x" * 5000 + b" 3 4"
    raw = b"\n".join(lines)
    tokens = _tokenise(raw, "f", (3, 3), False)[0]
    index = np.arange(0, len(tokens), 3)
    tracemalloc.start()
    try:
        picked = tokens.pick(index)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert picked.tolist() == raw.split()[::3]
    assert peak < 1.5 * picked.nbytes + 2 * _Tokens._CHUNK_BYTES * 9, (peak, picked.nbytes)


@pytest.mark.parametrize("fmt, name, lines", [
    ("csv", "ratings.csv", ["userId,movieId,rating,timestamp"] + [
        f"{u},{i},{(u * i) % 10 / 2 + 0.5},{964982703 + u}" for u in range(1, 40)
        for i in range(1, 300, 7)]),
    ("ml-1m", "ratings.dat", [f"{u}::{i}::{(u + i) % 5 + 1}::978300760" for u in range(1, 30)
                              for i in range(5, 4000, 131)]),
    ("csv", "amazon.csv", [f"A{u:013d},B{i:09d},{(u + i) % 5 + 1}.0,1400000000"
                           for u in range(25) for i in range(0, 900, 37)]),
    ("text", "big.txt", [f"{u} {i + 10 ** 19} {u % 5 + 1}" for u in range(20) for i in range(9)]),
], ids=["ml-latest-csv", "ml-1m", "string-ids", "ids-beyond-int64"])
def test_reads_as_a_python_split_reference(tmp_path, monkeypatch, fmt, name, lines):
    """Every id and rating as the lines split in Python give them, the tokens gathered in
    chunks smaller than a column (the gather's chunk boundaries)."""
    from nnsparse.data.readers import _Tokens
    monkeypatch.setattr(_Tokens, "_CHUNK", 7)
    path = tmp_path / name
    path.write_text("\r\n".join(lines) + "\r\n")
    r = read_ratings(path, fmt, titles=False)
    sep = {"csv": ",", "ml-1m": "::", "text": None}[fmt]
    rows = [line.split(sep) for line in lines[1 if fmt == "csv" and "userId" in lines[0] else 0:]]

    def value(text):
        return int(text) if re.fullmatch(r"[0-9]+", text) else text
    assert [r.user_ids()[u] for u in r.user.tolist()] == [value(row[0]) for row in rows]
    assert [r.item_ids()[i] for i in r.item.tolist()] == [value(row[1]) for row in rows]
    assert r.rating.tolist() == [float(row[2]) for row in rows]


# A refused assignment's advice names the fields that disagree (the titles' excess was
# told to replace user, item, rating and user_map, none of which it concerns)
AGREEING_FIELDS = [
    ("item", torch.tensor([0, 1]), "user=..., item=..., rating=..."),
    ("rating", torch.ones(2), "user=..., item=..., rating=..."),
    ("user", torch.tensor([0, 2, 1]), "user=..., user_map=..."),
    ("user_map", {10: 0}, "user=..., user_map=..."),
    ("item", torch.tensor([0, 1, 2]), "item=..., item_map=..."),
    ("item_map", {7: 0}, "item=..., item_map=..."),
    ("titles", ["a", "b", "c"], "item_map=..., titles=..."),
]


@pytest.mark.parametrize("name, value, fields", AGREEING_FIELDS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(AGREEING_FIELDS)])
def test_a_refused_assignment_names_the_fields_to_replace_together(name, value, fields):
    r = dataclasses.replace(_record(), titles=None)  # (a smaller item_map: no titles' refusal)
    with pytest.raises(ValueError, match=re.escape(
            f"; to change fields that must agree together, build a new record: "
            f"dataclasses.replace(ratings, {fields})") + "$"):
        setattr(r, name, value)
