"""read_ratings(format="auto"), the default, and a MovieLens directory as path: the real
layouts of the downloads, each written small here, read as their explicit format."""
import gzip
import pathlib
import re
import zipfile

import pytest
import torch

from nnsparse.data import (detect_format, read_item_features, read_ratings, read_split,
                           read_user_features)

# layout -> (its format, its rating file, {file name: content}); item files as the downloads
# have them: u.item and movies.dat in latin-1, movies.csv in UTF-8
LAYOUTS = {
    "ml-100k": ("ml-100k", "u.data", {
        "u.data": "196\t242\t3\t881250949\n186\t302\t3\t891717742\n22\t377\t1\t878887116\n",
        "u.item": "242|Kolya (1996)|24-Jan-1997||http://x|0|0\n"
                  "302|L.A. Confidential (1997)|01-Jan-1997||http://y|0|1\n"
                  "377|Café Heavyweights (1994)|01-Jan-1994||http://z|0|0\n".encode("latin-1"),
        "u1.base": "196\t242\t3\t881250949\n", "u1.test": "186\t302\t3\t891717742\n",
        "u.user": "1|24|M|technician|85711\n"}),
    "ml-1m": ("ml-1m", "ratings.dat", {
        "ratings.dat": "1::1193::5::978300760\n1::661::3::978302109\n2::1193::4::978298413\n",
        "movies.dat": "1193::One Flew Over the Cuckoo's Nest (1975)::Drama\n"
                      "661::James and the Giant Peach (1996)::Animation|Children's\n"
                      "3408::Amélie (2001)::Comedy\n".encode("latin-1"),
        "users.dat": "1::F::1::10::48067\n"}),
    "ml-10m": ("ml-1m", "ratings.dat", {
        "ratings.dat": "1::122::5::838985046\n1::185::4.5::838983525\n2::73::0.5::868245777\n",
        # ML-10M's files are UTF-8 (its README), ML-1M's latin-1
        "movies.dat": "122::Boomerang (1992)::Comedy|Romance\n185::Net, The (1995)::Action\n"
                      "73::Misérables, Les (1995)::Drama|War\n".encode("utf-8"),
        "tags.dat": "15::4973::excellent!::1215184630\n"}),
    "ml-20m": ("csv", "ratings.csv", {
        "ratings.csv": "userId,movieId,rating,timestamp\n1,2,3.5,1112486027\n1,29,4.0,1112484676\n"
                       "2,2,0.5,1112484819\n",
        "movies.csv": '''movieId,title,genres\n2,Jumanji (1995),Adventure\n29,"City of Lost
         Children, The (1995)",Drama\n'''.replace("\n         ", " ").encode("utf-8"),
        "tags.csv": "userId,movieId,tag,timestamp\n18,4141,Mark Waters,1240597180\n",
        "links.csv": "movieId,imdbId,tmdbId\n2,0113497,8844\n"}),
}


def write_layout(tmp_path, layout, rating_bytes=None):
    directory = tmp_path / layout
    directory.mkdir()
    fmt, name, files = LAYOUTS[layout]
    for file, content in files.items():
        data = content if isinstance(content, bytes) else content.encode()
        (directory / file).write_bytes(rating_bytes if file == name and rating_bytes else data)
    return directory, directory / name, fmt


def same(a, b):
    """Two reads gave one record: indices, ratings, maps and titles."""
    return (torch.equal(a.user, b.user) and torch.equal(a.item, b.item)
            and torch.equal(a.rating, b.rating) and a.user_map == b.user_map
            and a.item_map == b.item_map and a.titles == b.titles)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_reads_without_a_format(tmp_path, layout):
    directory, path, fmt = write_layout(tmp_path, layout)
    explicit = read_ratings(path, fmt)
    assert explicit.titles is not None and len(explicit) == 3
    for given in (path, str(path), directory, str(directory)):
        assert detect_format(given) == fmt
        assert same(read_ratings(given), explicit)
        assert same(read_ratings(given, "auto"), explicit)
    assert same(read_ratings(directory, fmt), explicit)  # an explicit format that agrees
    assert read_ratings(directory).source == str(path)


@pytest.mark.parametrize("layout, ratings, title", [
    ("ml-10m", [5.0, 4.5, 0.5], "Misérables, Les (1995)"),  # UTF-8 (latin-1 before)
    ("ml-1m", [5.0, 3.0, 4.0], "James and the Giant Peach (1996)"),
    ("ml-100k", [3.0, 3.0, 1.0], "Café Heavyweights (1994)"),
    ("ml-20m", [3.5, 4.0, 0.5], "City of Lost Children, The (1995)"),
])
def test_layout_values(tmp_path, layout, ratings, title):
    directory, _, _ = write_layout(tmp_path, layout)
    r = read_ratings(directory)
    assert r.rating.tolist() == ratings and title in r.titles


@pytest.mark.parametrize("name, fmt, line, encoding", [
    ("u.item", "ml-100k", "7|Café Noir (1996)|01-Jan-1996||http://x|0|1", "latin-1"),
    ("movies.dat", "ml-1m", "7::Misérables, Les (1995)::Drama|Musical", "latin-1"),  # ML-1M
    ("movies.dat", "ml-1m", "7::Misérables, Les (1995)::Drama|Musical", "utf-8"),    # ML-10M
    ("movies.dat", "ml-1m", "7::Cité des enfants perdus, La (1995)::Sci-Fi", "utf-8"),
    ("u.item", "ml-100k", "7|Café Noir (1996)|01-Jan-1996||http://x|0|1", "utf-8"),
], ids=["ml-100k-latin1", "ml-1m-latin1", "ml-10m-utf8", "ml-10m-utf8-2", "u.item-utf8"])
@pytest.mark.parametrize("bom, newline", [(b"", b"\n"), (b"\xef\xbb\xbf", b"\r\n")],
                         ids=["lf", "bom-crlf"])
def test_item_file_titles_in_utf8_or_latin1(tmp_path, name, fmt, line, encoding, bom, newline):
    """A u.item or movies.dat is read as UTF-8 when it is (MovieLens-10M's movies.dat; it
    was read as latin-1, 'MisÃ©rables'), else as latin-1 (MovieLens-100K's and -1M's)."""
    sep = "|" if fmt == "ml-100k" else "::"
    (tmp_path / name).write_bytes(bom + f"1{sep}Plain (1990){sep}x\n{line}\n".encode(encoding)
                                  .replace(b"\n", newline))
    ratings = tmp_path / ("u.data" if fmt == "ml-100k" else "ratings.dat")
    between = "\t" if fmt == "ml-100k" else "::"
    ratings.write_text(f"1{between}7{between}4{between}0\n1{between}1{between}3{between}0\n")
    title = line.split(sep)[1]
    assert read_ratings(ratings).titles == ["Plain (1990)", title]
    assert read_ratings(tmp_path, fmt).titles == ["Plain (1990)", title]


_B = b"\xef\xbb\xbf"  # a UTF-8 byte order mark
_MOVIES_DAT = b"1::A (1995)::Drama\n2::B (1996)::Comedy|Drama\n"
_U_ITEM = (b"1|A (1995)|01-Jan-1995||u|" + b"|".join([b"0"] * 18 + [b"1"]) + b"\n"
           b"2|B (1996)|01-Jan-1996||u|" + b"|".join([b"1"] + [b"0"] * 18) + b"\n")
_MOVIES_CSV = b"movieId,title,genres\n1,A (1995),Drama\n2,B (1996),Comedy|Drama\n"
_USERS_DAT = b"1::F::1::10::48067\n2::M::56::16::70072\n"
_U_USER = b"1|24|M|technician|85711\n2|53|F|other|94043\n"
# format -> (rating file, item file, user file): its side files beside one rating file
_SIDE = {"ml-1m": ("ratings.dat", b"1::1::4::0\n2::2::3::0\n", "movies.dat", _MOVIES_DAT,
                   "users.dat", _USERS_DAT),
         "ml-100k": ("u.data", b"1\t1\t4\t0\n2\t2\t3\t0\n", "u.item", _U_ITEM, "u.user", _U_USER),
         "csv": ("ratings.csv", b"1,1,4\n2,2,3\n", "movies.csv", _MOVIES_CSV, None, None)}


@pytest.mark.parametrize("fmt", list(_SIDE))
@pytest.mark.parametrize("head", [
    _B, _B + b"\n", _B + b"\r\n", _B + b"  \n", _B + b"\n\n", b"\n", b"\r\n \n", _B + b"\r",
], ids=["bom", "bom-blank-line", "bom-crlf-blank-line", "bom-spaces", "bom-two-blank-lines",
        "blank-line", "blank-lines", "bom-cr"])
def test_item_and_user_files_read_a_byte_order_mark_as_the_titles_do(tmp_path, fmt, head):
    """Titles and side features read a file with one helper (_side_lines, _without_bom): a
    byte order mark alone on the first line was a blank line to the titles and a malformed
    line 1 to read_item_features and read_user_features ("expected 'id::title::genres'");
    a movies.csv header after a blank line was read as the item 'movieId' of the genre
    'genres' (an extra feature column), the header of the titles too."""
    rating_name, ratings, item_name, items, user_name, users = _SIDE[fmt]
    plain, headed = tmp_path / "plain", tmp_path / "headed"
    for directory, prefix in ((plain, b""), (headed, head)):
        directory.mkdir()
        (directory / rating_name).write_bytes(ratings)
        (directory / item_name).write_bytes(prefix + items)
        if user_name:
            (directory / user_name).write_bytes(prefix + users)
    reference = read_ratings(plain)
    assert reference.titles == ["A (1995)", "B (1996)"]
    assert read_ratings(headed).titles == reference.titles
    features = read_item_features(headed / item_name, fmt, reference.item_map)
    expected = read_item_features(plain / item_name, fmt, reference.item_map)
    assert features.shape == expected.shape and torch.equal(features, expected)
    if user_name:
        assert torch.equal(read_user_features(headed / user_name, fmt, reference.user_map),
                           read_user_features(plain / user_name, fmt, reference.user_map))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bom, newline", [(b"", b"\r\n"), (b"\xef\xbb\xbf", b"\n"),
                                          (b"\xef\xbb\xbf", b"\r\n"), (b"\n\n", b"\n")])
def test_crlf_bom_and_blank_head_under_auto(tmp_path, layout, bom, newline):
    fmt, name, files = LAYOUTS[layout]
    plain = read_ratings(write_layout(tmp_path, layout)[1], fmt)
    other = tmp_path / "other"
    other.mkdir()
    data = bom + files[name].encode().replace(b"\n", newline)
    directory, path, _ = write_layout(other, layout, data)
    assert detect_format(path) == fmt
    assert same(read_ratings(path), plain) and same(read_ratings(directory), plain)


@pytest.mark.parametrize("text", [
    "alice  book1 4\nbob book2 2.5 123\n",        # whitespace, 3 and 4 fields
    "1 2 3 0\n4 5 1 0\n",                         # spaces, 4 numeric fields
    "1\t2\t3\n4\t5\t1\n",                         # tabs, 3 fields
    "alice\tbook\t4\t0\nbob\tbook\t2\t0\n",        # tabs, 4 fields, string ids
    "1_0\t2\t3\t0\n10\t2\t4\t0\n",                # an id with '_' is a text id
    "a::b c 4\nd e 3\n",                          # '::' inside an id
    "a,b c 4\nd e 3\n",                           # a comma inside an id
    "\ufeffjosé zoë 4\n",                         # a byte order mark, UTF-8 ids
])
def test_text_files_still_read_as_text(tmp_path, text):
    path = tmp_path / "ratings.txt"
    path.write_text(text, encoding="utf-8")
    assert detect_format(path) == "text"
    assert same(read_ratings(path), read_ratings(path, "text"))


def test_tab_separated_integer_file_reads_as_ml100k_with_the_same_numbers(tmp_path):
    path = tmp_path / "mine.tsv"
    path.write_text("7\t30\t4\t0\n3\t31\t2.5\t0\n7\t31\t1\t0\n")
    assert detect_format(path) == "ml-100k"
    auto, text = read_ratings(path), read_ratings(path, "text")
    assert same(auto, text) and auto.titles is None  # no u.item beside it: no titles
    (tmp_path / "u.item").write_text("30|Thirty|x\n31|Thirty-one|x\n")
    assert read_ratings(path).titles == ["Thirty", "Thirty-one"]
    assert read_ratings(path, "text").titles is None


def test_paths_starting_with_a_tilde_are_the_home_directory(tmp_path, monkeypatch):
    """``"~/ml-100k"`` is read as pandas reads it (a shell leaves ``--x=~/...`` as it is);
    every reader's path and fold_files' directory."""
    from nnsparse.data import read_item_features, read_user_features
    from nnsparse.models import fold_files
    monkeypatch.setenv("HOME", str(tmp_path))
    directory, path, _ = write_layout(tmp_path, "ml-100k")
    plain = read_ratings(path)
    for given in ("~/ml-100k", "~/ml-100k/", "~/ml-100k/u.data", pathlib.Path("~/ml-100k")):
        assert detect_format(given) == "ml-100k" and same(read_ratings(given), plain)
    assert same(read_ratings(path, titles="~/ml-100k/u.item"), plain)
    pair = read_split(directory / "u1.base", directory / "u1.test")
    for got, want in zip(read_split("~/ml-100k/u1.base", "~/ml-100k/u1.test"), pair):
        assert same(got, want)
    for got, want in zip(next(fold_files("~/ml-100k")), pair):
        assert same(got, want)
    assert torch.equal(read_item_features("~/ml-100k/u.item", "ml-100k", plain.item_map),
                       read_item_features(directory / "u.item", "ml-100k", plain.item_map))
    users = {1: 0}
    assert torch.equal(read_user_features("~/ml-100k/u.user", "ml-100k", users),
                       read_user_features(directory / "u.user", "ml-100k", users))


def test_files_written_and_read_by_models_take_a_tilde_too(tmp_path, monkeypatch):
    """Every public path, not the readers' only: RatingModel.save / load and
    nnsparse.distributed.save expand ``~`` as the readers do (they wrote under ./~)."""
    import nnsparse.distributed as nd
    from nnsparse.data import synthetic_ratings
    from nnsparse.models import AutoRec, RatingModel
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    data = synthetic_ratings(0, 20, 15, 120)
    model = AutoRec(hidden=4, epochs=1, validation_ratio=0.0).fit(data, verbose=False,
                                                                   progress=False)
    for given in ("~/m.pt", pathlib.Path("~/m.pt")):
        model.save(given)
        assert (home / "m.pt").is_file()
        assert torch.equal(RatingModel.load(given).predict(data), model.predict(data))
        assert torch.equal(AutoRec.load(given).predict(data), model.predict(data))
        (home / "m.pt").unlink()
        nd.save({"step": torch.tensor(3)}, given)
        assert torch.load(home / "m.pt", weights_only=True) == {"step": torch.tensor(3)}
        (home / "m.pt").unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # nothing under ./~
    with pytest.raises(FileNotFoundError, match=rf"^path: no file at {home}/none\.pt$"):
        RatingModel.load("~/none.pt")


def test_a_tilde_of_no_user_is_a_name(tmp_path, monkeypatch):
    """``~name`` of no user stays as it is, as the shell and pandas (os.path.expanduser)
    leave it: a file called ``~ratings.csv`` reads, a missing one is the usual error
    (Path.expanduser raised RuntimeError: 'Could not determine home directory')."""
    from nnsparse.models import fold_files
    monkeypatch.chdir(tmp_path)
    user = "~no-such-user-nnsparse"
    pathlib.Path(f"{user}.csv").write_text("1,2,3.5\n")
    assert read_ratings(f"{user}.csv").rating.tolist() == [3.5]
    assert detect_format(pathlib.Path(f"{user}.csv")) == "csv"
    with pytest.raises(ValueError, match=rf"^path: no rating file at {user}/r\.csv \(it "
                                         rf"does not exist\)$"):
        read_ratings(f"{user}/r.csv")
    with pytest.raises(ValueError, match=rf"^folds: no directory at {user}$"):
        fold_files(user)
    with pytest.raises(ValueError, match=rf"^titles: no item file at {user}/u\.item$"):
        read_ratings(f"{user}.csv", titles=f"{user}/u.item")


def test_read_split_detects_the_training_file(tmp_path):
    directory, _, _ = write_layout(tmp_path, "ml-100k")
    base, test = directory / "u1.base", directory / "u1.test"
    auto = read_split(base, test)
    explicit = read_split(base, test, "ml-100k")
    assert all(same(a, b) for a, b in zip(auto, explicit))
    assert auto[0].titles[:1] == ["Kolya (1996)"]


def test_fold_files_detects_each_fold_by_default(tmp_path):
    """fold_files defaults to "auto", as read_split: the u<N>.base/.test of ML-100K read
    as with "ml-100k" (titles from u.item too); folds saved in another format read too."""
    from nnsparse.models import fold_files
    directory, _, _ = write_layout(tmp_path, "ml-100k")
    (directory / "u2.base").write_text("196\t242\t3\t881250949\n22\t377\t1\t878887116\n")
    (directory / "u2.test").write_text("186\t302\t3\t891717742\n")
    auto, explicit = list(fold_files(directory)), list(fold_files(directory, "ml-100k"))
    assert len(auto) == len(explicit) == 2
    assert all(same(a, b) for fa, fb in zip(auto, explicit) for a, b in zip(fa, fb))
    assert auto[0][0].titles[:1] == ["Kolya (1996)"]
    spaced = tmp_path / "spaced"  # "user item rating", space-separated: "text", not ml-100k
    spaced.mkdir()
    (spaced / "u1.base").write_text("a x 4\nb y 2\n")
    (spaced / "u1.test").write_text("a y 3\n")
    (train, test), = fold_files(spaced)
    assert train.user_map == {"a": 0, "b": 1} and test.rating.tolist() == [3.0]
    with pytest.raises(ValueError, match="line 1: expected 4 fields, got 3"):
        list(fold_files(spaced, "ml-100k"))


def test_fold_files_reads_ml10m_split_ratings_folds(tmp_path):
    """MovieLens-10M's split_ratings.sh writes r1.train/r1.test ... r5 (and ra/rb, per-user
    splits, no folds) in its '::' format: fold_files reads them as it reads ML-100K's u<N>
    pairs (it found none: 'holds no u<N>.base / u<N>.test pair'), titles from movies.dat."""
    from nnsparse.models import fold_files
    directory, _, _ = write_layout(tmp_path, "ml-10m")
    lines = ["1::122::5::838985046\n", "1::185::4.5::838983525\n", "2::73::0.5::868245777\n",
             "2::122::3::868245778\n"]
    for n in (1, 2):
        (directory / f"r{n}.train").write_text("".join(lines[:2] if n == 1 else lines[1:]))
        (directory / f"r{n}.test").write_text(lines[3] if n == 1 else lines[0])
    for name in ("ra.train", "ra.test", "r3.train"):  # no folds / a fold without its test
        (directory / name).write_text(lines[0])
    folds = list(fold_files(str(directory) + "/"))
    assert [(len(train), len(test)) for train, test in folds] == [(2, 1), (3, 1)]
    explicit = list(fold_files(directory, "ml-1m"))
    assert all(same(a, b) for fa, fb in zip(folds, explicit) for a, b in zip(fa, fb))
    assert folds[1][0].titles[folds[1][0].item_map[73]] == "Misérables, Les (1995)"
    (directory / "u1.base").write_text("1\t2\t3\t0\n")
    (directory / "u1.test").write_text("1\t3\t3\t0\n")
    with pytest.raises(ValueError, match=r"folds: .* holds both u<N>\.base / u<N>\.test and "
                                         r"r<N>\.train / r<N>\.test pairs; give a directory "
                                         r"of one set of folds$"):
        fold_files(directory)
    with pytest.raises(ValueError, match=r"folds: .* holds no u<N>\.base / u<N>\.test pair "
                                         r"\(MovieLens-100K\) nor r<N>\.train / r<N>\.test "
                                         r"pair \(MovieLens-10M's split_ratings\.sh\)$"):
        fold_files(tmp_path)


def _gzip(tmp_path):
    path = tmp_path / "ratings.dat"
    path.write_bytes(gzip.compress(b"1::2::3::4\n"))
    return path


def _zip(name, *members):
    """A zip archive as grouplens ships them: ``name`` holding ``members`` (paths inside)."""
    def make(tmp_path):
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as archive:
            for member in members:
                archive.writestr(member, "1::2::3::4\n")
        return path
    return make


def _patched_zip(name, *patches):
    """A zip archive of ``ml-1m/rX.dat`` whose central directory entry has the bytes
    ``value`` at ``offset`` for each ``(offset, value)`` of ``patches``: the version it
    needs (6), its flags (8), its name (46 on)."""
    def make(tmp_path):
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("ml-1m/rX.dat", "1::2::3::4\n")
        data = bytearray(path.read_bytes())
        entry = data.index(b"PK\x01\x02")
        for offset, value in patches:
            data[entry + offset:entry + offset + len(value)] = value
        path.write_bytes(bytes(data))
        return path
    return make


def _file(name, text):
    def make(tmp_path):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path
    return make


def _dir(*names, subdirs=()):
    def make(tmp_path):
        directory = tmp_path / "data"
        directory.mkdir()
        for name in names:
            (directory / name).write_text("1::2::3::4\n" if name.endswith(".dat")
                                          else "1,2,3,4\n" if name.endswith(".csv") else
                                          "1\t2\t3\t4\n")
        for sub in subdirs:
            (directory / sub).mkdir()
        return directory
    return make


# (id, the path made in tmp_path, format, expected message (regex))
BAD = [
    # (3 comma-separated fields, 'a,b,c', were refused here: format 'csv' reads them now,
    # test_data_readers.py's CSV3 table)
    ("two-commas", _file("r.csv", "a,b\n1,2\n"), "auto",
     r"path: cannot detect the format of .*r\.csv: its first line 'a,b' has 2 "
     r"comma-separated fields, and format 'csv' reads 3 or 4, user,item,rating\[,timestamp\] "
     r"\(MovieLens ratings\.csv: userId,movieId,rating,timestamp\); no format reads 2 "
     r"comma-separated fields: save the file whitespace-separated, 'user item rating "
     r"\[timestamp\]', and give format 'text'$"),
    # (no format reads such a file: csv needs 3 or 4 fields, text whitespace; the message
    # said "give format= (one of [...])")
    ("five-commas-after-bom-and-blank", _file("ratings.csv", "\ufeff\n1,2,3.5,0,x\n"), "auto",
     r"its first line '1,2,3\.5,0,x' has 5 comma-separated fields, .*; no format reads 5 "
     r"comma-separated fields: save the file whitespace-separated"),
    ("ml100k-name-bad-id", _file("u1.base", "1\tx\t3\t0\n"), "auto",
     r"u1\.base, line 1: the item id must be an integer, got 'x' \(format 'auto' read u1\.base "
     r"as 'ml-100k', from its first line; give format= to read another\)"),
    ("detected-ml100k-later-string-id", _file("t.tsv", "1\t2\t3\t0\n1\tbob\t3\t0\n"), "auto",
     r"t\.tsv, line 2: the item id must be an integer, got 'bob' \(format 'auto' read t\.tsv "
     r"as 'ml-100k'"),
    ("detected-ml100k-later-three-fields", _file("t.tsv", "1\t2\t3\t0\n1\t3\t4\n"), "auto",
     r"t\.tsv, line 2: expected 4 fields, got 3: '1\\t3\\t4' \(format 'auto' read t\.tsv as "
     r"'ml-100k', from its first line; give format= to read another\)$"),  # text reads it
    ("detected-ml1m-bad-count", _file("r.dat", "1::2::3\n"), "auto",
     r"r\.dat, line 1: expected 4 fields, got 3: '1::2::3' \(format 'auto' read r\.dat as "
     r"'ml-1m'"),
    ("detected-text-bad-line", _file("r.txt", "a b 1\nc d\n"), "auto",
     r"r\.txt, line 2: expected 3 to 4 fields, got 2: 'c d' \(format 'auto' read r\.txt as "
     r"'text'"),
    ("gzip", _gzip, "auto", r"path: .*ratings\.dat is gzip-compressed"),
    # a zip names the rating file it holds and the folder it unzips to (ML-10M's is not
    # ml-10m/); it said "e.g. ml-1m/ratings.dat" of every archive
    ("zip-ml-10m", _zip("ml-10m.zip", "ml-10M100K/movies.dat", "ml-10M100K/ratings.dat",
                        "ml-10M100K/tags.dat"), "auto",
     r"path: .*ml-10m\.zip is a zip archive \(it starts with b'PK\\x03\\x04'\), not a text "
     r"file; extract it and give the rating file in it or its directory \(it holds "
     r"ml-10M100K/ratings\.dat; unzip ml-10m\.zip makes ml-10M100K/\)$"),
    ("zip-ml-100k-explicit-format", _zip("ml-100k.zip", "ml-100k/u.data", "ml-100k/u1.base"),
     "ml-100k", r"ml-100k\.zip is a zip archive .* \(it holds ml-100k/u\.data; unzip "
                r"ml-100k\.zip makes ml-100k/\)$"),
    ("zip-flat", _zip("r.zip", "ratings.csv"), "auto", r"r\.zip is a zip archive .*"
     r"extract it and give the rating file in it or its directory \(it holds ratings\.csv\)$"),
    ("zip-no-rating-file", _zip("x.zip", "data/notes.txt"), "auto", r"x\.zip is a zip archive "
     r".*extract it and give the rating file in it \(e\.g\. ml-1m/ratings\.dat\)$"),
    ("zip-damaged", _file("d.zip", "PK\x03\x04 and no archive"), "auto", r"d\.zip is a zip "
     r"archive .*extract it and give the rating file in it \(e\.g\. ml-1m/ratings\.dat\)$"),
    # zipfile raised NotImplementedError / UnicodeDecodeError out of the hint
    ("zip-version-unsupported", _patched_zip("v.zip", (6, b"\x63\x00")), "auto", r"v\.zip is a "
     r"zip archive .*extract it and give the rating file in it \(e\.g\. ml-1m/ratings\.dat\)$"),
    ("zip-name-not-utf8", _patched_zip("u.zip", (8, b"\x00\x08"), (53, b"\xe9")), "auto",
     r"u\.zip is a zip archive .*extract it and give the rating file in it \(e\.g\. "
     r"ml-1m/ratings\.dat\)$"),
    ("dir-none", _dir("notes.txt", subdirs=["ml-1m"]), "auto",
     r"path: .*data is a directory; give the rating file in it: looked for one of "
     r"ratings\.dat, ratings\.csv, u\.data, found none \(it holds ml-1m/, notes\.txt\)$"),
    ("dir-empty", _dir(), "ml-1m", r"data is a directory; give the rating file in it: .*"
                                   r"found none \(it holds nothing\)$"),
    ("dir-many-names", _dir(*[f"f{k}.txt" for k in range(10)]), "auto",
     r"found none \(it holds f0\.txt, f1\.txt, .*f7\.txt, \.\.\. \(10 in all\)\)$"),
    ("dir-several", _dir("u.data", "ratings.dat", "movies.dat"), "auto",
     r"data is a directory; give the rating file in it: looked for one of ratings\.dat, "
     r"ratings\.csv, u\.data, found 2: ratings\.dat, u\.data$"),
    ("dir-format-disagrees", _dir("ratings.csv"), "ml-1m",
     r"path: .*data holds ratings\.csv, a file of format 'csv', but format is 'ml-1m'; give "
     r"format 'csv' or 'auto', or the rating file itself"),
    ("dir-text-format", _dir("ratings.dat"), "text",
     r"holds ratings\.dat, a file of format 'ml-1m', but format is 'text'"),
    ("missing", lambda tmp_path: tmp_path / "nothing.dat", "auto",
     r"path: no rating file at .*nothing\.dat \(it does not exist\)"),
    # a download's other file, beside its ratings: genome-scores.csv (movieId,tagId,
    # relevance) was read as 3-column ratings; movies.dat, tags.dat failed on a field
    ("genome-scores-beside-ratings", lambda tmp_path: _dir("ratings.csv", "genome-scores.csv")(
        tmp_path) / "genome-scores.csv", "auto",
     r"path: .*data/genome-scores\.csv is no rating file: it is MovieLens's tag genome file, "
     r"beside the download's ratings, ratings\.csv; give .*data/ratings\.csv or the "
     r"directory .*data$"),
    ("tags-dat-beside-ratings", lambda tmp_path: _dir("ratings.dat", "tags.dat")(
        tmp_path) / "tags.dat", "ml-1m", r"tags\.dat is no rating file: it is MovieLens's tag "
                                          r"file, beside the download's ratings, ratings\.dat"),
    ("u-item-beside-u-data", lambda tmp_path: _dir("u.data", "u.item")(tmp_path) / "u.item",
     "auto", r"u\.item is no rating file: it is MovieLens's item file, beside the download's "
             r"ratings, u\.data"),
]


@pytest.mark.parametrize("make, fmt, message", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_files_and_directories(tmp_path, make, fmt, message):
    path = make(tmp_path)
    with pytest.raises(ValueError, match=message):
        read_ratings(path, fmt)
    if fmt == "auto" and "format 'auto' read" not in message:  # detection's own refusals
        with pytest.raises(ValueError, match=message):
            detect_format(path)


@pytest.mark.parametrize("name, beside", [
    ("tags.csv", None), ("movies.dat", None), ("genome-scores.csv", None),
    # beside another download's rating file: ML-1M has no movies.csv, ML-20M no movies.dat
    ("movies.csv", "ratings.dat"), ("tags.csv", "u.data"), ("movies.dat", "ratings.csv"),
    ("u.item", "ratings.csv")])
def test_a_movielens_side_file_name_alone_is_a_rating_file(tmp_path, name, beside):
    """Only beside its own download's rating file is such a name refused: a rating file of
    one's own may be called so (it was refused beside any MovieLens rating file, 'it is
    MovieLens's item file' of a movies.csv in ml-1m/)."""
    if beside is not None:
        (tmp_path / beside).write_text("1::2::3::0\n")
    path = tmp_path / name
    path.write_text("1,2,3.5\n" if name.endswith(".csv") else "1::2::3.5::0\n")
    assert read_ratings(path).rating.tolist() == [3.5]


def test_detect_format_and_read_split_arguments(tmp_path):
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, got int"):
        detect_format(3)
    directory, path, _ = write_layout(tmp_path, "ml-1m")
    with pytest.raises(ValueError, match=rf"train: {re.escape(str(directory))} is a directory; "
                                         r"give the rating file in it"):
        read_split(directory, path)
    with pytest.raises(ValueError, match=r"test: .* is a directory"):
        read_split(path, directory)
    with pytest.raises(ValueError, match=r"format must be one of \['auto', 'ml-100k', 'ml-1m', "
                                         r"'csv', 'text'\], got 'ml-20m'"):
        read_ratings(path, "ml-20m")


def test_detection_reads_past_a_long_blank_head_and_a_long_first_line(tmp_path):
    # the first line is found however far it lies, and read whole: (64 KiB were read before,
    # so 70,000 blank lines hid an ml-1m file as 'text', and a cut header lost its 4th field)
    blank_head = tmp_path / "r.dat"
    blank_head.write_bytes(b"\n" * 70_000 + b"1::2::3::4\n2::1::5::0\n")
    long_header = tmp_path / "r.csv"
    long_header.write_bytes(b"userId,movieId," + b"r" * 70_000 + b",timestamp\n1,2,3.5,0\n")
    for path, fmt in ((blank_head, "ml-1m"), (long_header, "csv")):
        assert detect_format(path) == fmt
        assert same(read_ratings(path), read_ratings(path, fmt))


@pytest.mark.parametrize("content", [b"", b"\n \n\r\n\t\n", b"\xef\xbb\xbf\n\n"],
                         ids=["empty", "blank-lines", "bom-and-blank-lines"])
def test_an_empty_file_is_refused_as_empty_not_as_a_format(tmp_path, content):
    path = tmp_path / "r.txt"
    path.write_bytes(content)
    message = rf"^{re.escape(str(path))} holds no ratings \(empty file\)$"  # no "give format="
    with pytest.raises(ValueError, match=message):
        detect_format(path)
    with pytest.raises(ValueError, match=message):
        read_ratings(path)
    with pytest.raises(ValueError, match=message):
        read_ratings(path, "text")


# errors of ratings whose lines parsed: another format would not cure them, so "auto" gives
# the explicit format's message, without "format 'auto' read ... give format= to read another"
PARSED = [
    ("repeated-pair", "1::2::3::978300760\n1::2::4::978300761\n",
     r"r\.dat: 1 \(user, item\) pair rated more than once, e\.g\. user 1 and item 2 "
     r"\(lines 1, 2\)"),
    ("overflow", "1::2::1e39::978300760\n", r"r\.dat, line 1: the rating '1e39' overflows"),
]


@pytest.mark.parametrize("content, message", [c[1:] for c in PARSED], ids=[c[0] for c in PARSED])
def test_errors_of_parsed_ratings_do_not_blame_the_detected_format(tmp_path, content, message):
    path = tmp_path / "r.dat"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as explicit:
        read_ratings(path, "ml-1m")
    with pytest.raises(ValueError, match=message) as auto:
        read_ratings(path)
    assert str(auto.value) == str(explicit.value)
    assert "format 'auto'" not in str(auto.value)


def test_a_mixed_tab_file_that_auto_refuses_reads_as_text(tmp_path):
    # the documented way out of "detected-ml100k-later-three-fields" and "-later-string-id"
    path = tmp_path / "t.tsv"
    path.write_text("1\t2\t3\t0\n1\t3\t4\n1\tbob\t5\t0\n")
    r = read_ratings(path, "text")
    assert r.item_map == {"2": 0, "3": 1, "bob": 2} and r.rating.tolist() == [3.0, 4.0, 5.0]
