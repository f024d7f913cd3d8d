"""Where the readers say a file is wrong, and four files they misread (session 24).

* An item or user file of both encodings (UTF-8 text and one byte that is no UTF-8) was
  decoded wholly as latin-1: every UTF-8 title garbled silently (``'AmÃ©lie'``).  It is
  refused, naming both lines; a file of one encoding reads as before (MovieLens-100K's
  ``u.item`` and -1M's ``movies.dat`` latin-1, -10M's ``movies.dat`` UTF-8).
* ``movies.csv`` messages counted csv records as lines: a quoted title holding a newline
  put every later line number off.  They give the physical line a record starts on.
* A lone ``'\\r'`` (classic Mac OS line endings) was looked for on the first line only:
  ``2 20\\r3 30`` on a later line read as user 2, item 20, rating 3, silently.
* A string id that is no UTF-8 named its byte within the id, not within its line.
* A ``movies.csv`` title with an unquoted comma was cut at it, its second half read as
  the genres: a record wider than the file's first line is refused.

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result).
"""
import ast
import os
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from probe_cases import Case, run_case
from nnsparse.data import read_item_features, read_ratings, read_user_features

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _files(files: Dict[str, bytes], call: Callable[[Path], Any]) -> Callable[[Path], Any]:
    """A call of ``call(tmp_path)`` once ``files`` (name -> bytes) are written there."""
    def run(tmp_path: Path) -> Any:
        for name, data in files.items():
            (tmp_path / name).write_bytes(data)
        return call(tmp_path)
    return run


def _titles(rating_file: str, data: bytes, fmt: str, **files: bytes) -> Callable[[Path], Any]:
    """The titles read_ratings reads for ``data`` (``rating_file``) beside ``files``."""
    return _files({rating_file: data, **{k.replace("_", "."): v for k, v in files.items()}},
                  lambda p: read_ratings(p / rating_file, fmt).titles)


def _ratings(name: str, data: bytes, fmt: str = "auto") -> Callable[[Path], Any]:
    return _files({name: data}, lambda p: read_ratings(p / name, fmt, titles=False))


# -- 1. an item or user file of two encodings -------------------------------------------

_AMELIE = "Amélie (2001)".encode("utf-8")  # é: the two bytes C3 A9
_CAFE = "Café (1995)".encode("latin-1")  # é: the one byte E9
_FLAGS = b"|".join([b"0"] * 18 + [b"1"])
_R1M = b"1::1::4::0\n1::2::3::0\n"
_R100K = b"1\t1\t4\t0\n1\t2\t3\t0\n"


def _item(n: int, title: bytes) -> bytes:
    """A u.item line."""
    return b"%d|" % n + title + b"|01-Jan-1995||http://x|" + _FLAGS + b"\n"


def _mixed(name: str, line: int, byte: int, quote: str, utf8_line: int, utf8: str,
           fix: str = ", or pass titles=False", what: str = "item file") -> str:
    return (rf"^{name}: .*, line {line}: expected UTF-8 or latin-1 text throughout the {what}, "
            rf"got the byte b'\\xe9' \(no UTF-8: invalid continuation byte; byte {byte} of the "
            rf"file\) in '{quote}' and UTF-8 text on line {utf8_line} \('{utf8}'\); read as "
            rf"latin-1, every UTF-8 character would be garbled: re-encode the latin-1 lines as "
            rf"UTF-8{fix}$")


#: the accented titles of MovieLens-1M's movies.dat (one of each letter it holds), under
#: ids 1..17, each line's first genre Drama (the features' first genre column)
_ML1M_TITLES = [
    "Slingshot, The (Kådisbellan ) (1993)", "Cold Fever (Á köldum klaka) (1994)",
    "Alien³ (1992)", "Zero Kelvin (Kjærlighetens kjøtere) (1995)",
    "Midaq Alley (Callejón de los milagros, El) (1995)", "Life of Émile Zola, The (1937)",
    "Autumn Sonata (Höstsonaten ) (1978)", "Déjà Vu (1997)",
    "Dreamlife of Angels, The (La Vie rêvée des anges) (1998)",
    "Jeanne and the Perfect Guy (Jeanne et le garçon formidable) (1998)",
    "Late August, Early September (Fin août, début septembre) (1998)",
    "Gambler, The (A Játékos) (1997)",
    "Not Love, Just Frenzy (Más que amor, frenesí) (1996)",
    "Freedom for Us (À nous la liberté ) (1931)", "Cleo From 5 to 7 (Cléo de 5 à 7) (1962)",
    "Other Side of Sunday, The (Søndagsengler) (1996)",
    "And God Created Woman (Et Dieu&#8230;Créa la Femme) (1956)"]
_ML1M_MOVIES = "".join(f"{k}::{t}::Drama|Comedy\n" for k, t in enumerate(_ML1M_TITLES, 1))
_ML1M_RATINGS = b"".join(b"1::%d::4::0\n" % k for k in range(1, 18))
_UTF8_THEN_LATIN1 = b"1::" + _AMELIE + b"::Drama\n2::" + _CAFE + b"::Drama\n"
_LATIN1_THEN_UTF8 = b"2::" + _CAFE + b"::Drama\n1::" + _AMELIE + b"::Drama\n"

_ENCODING_CASES: List[Case] = [
    # the bug: a UTF-8 movies.dat with one stray latin-1 byte read as ['AmÃ©lie (2001)', ...]
    Case("titles-ml-1m-utf8-then-a-stray-byte",
         _titles("ratings.dat", _R1M, "ml-1m", movies_dat=_UTF8_THEN_LATIN1), ValueError,
         _mixed("titles", 2, _UTF8_THEN_LATIN1.index(b"\xe9"), r"2::Café \(1995\)::Drama", 1,
                r"1::Amélie \(2001\)::Drama")),
    # a latin-1 file with a line pasted as UTF-8: both lines named alike
    Case("titles-ml-1m-latin1-then-utf8",
         _titles("ratings.dat", _R1M, "ml-1m", movies_dat=_LATIN1_THEN_UTF8), ValueError,
         _mixed("titles", 1, _LATIN1_THEN_UTF8.index(b"\xe9"), r"2::Café \(1995\)::Drama", 2,
                r"1::Amélie \(2001\)::Drama")),
    # both on one line, quoted as read: its UTF-8 as UTF-8, the stray byte as latin-1
    Case("titles-ml-1m-one-line", _titles("ratings.dat", b"1::1::4::0\n", "ml-1m",
                                          movies_dat=b"1::" + _AMELIE + b" " + _CAFE + b"::D\n"),
         ValueError, _mixed("titles", 1, 21, r"1::Amélie \(2001\) Café \(1995\)::D", 1,
                            r"1::Amélie \(2001\) Café \(1995\)::D")),
    Case("titles-ml-100k", _titles("u.data", _R100K, "ml-100k",
                                   u_item=_item(1, _AMELIE) + _item(2, _CAFE)),
         ValueError, _mixed("titles", 2, len(_item(1, _AMELIE)) + 5, r"2\|Café .*", 1,
                            r"1\|Amélie .*")),
    # the features read the same files: refused alike, without titles=False's advice
    Case("item-features-ml-1m", _files({"movies.dat": _UTF8_THEN_LATIN1}, lambda p:
                                       read_item_features(p / "movies.dat", "ml-1m", {1: 0})),
         ValueError, _mixed("path", 2, _UTF8_THEN_LATIN1.index(b"\xe9"), r".*", 1, r".*",
                            fix="")),
    Case("item-features-ml-100k",
         _files({"u.item": _item(1, _AMELIE) + _item(2, _CAFE)},
                lambda p: read_item_features(p / "u.item", "ml-100k", {1: 0})),
         ValueError, _mixed("path", 2, len(_item(1, _AMELIE)) + 5, r".*", 1, r".*", fix="")),
    Case("user-features-ml-1m",
         _files({"users.dat": "1::F::1::10::Zoë\n2::M::1::10::t\xe9\n".encode("latin-1")
                 .replace(b"Zo\xeb", "Zoë".encode())},
                lambda p: read_user_features(p / "users.dat", "ml-1m", {1: 0, 2: 1})),
         ValueError, _mixed("path", 2, 32, r"2::M::1::10::té", 1, r"1::F::1::10::Zoë", fix="",
                            what="user file")),
    # a movies.csv is UTF-8 (MovieLens says so): refused as before, by the first bad byte
    Case("titles-csv", _titles("ratings.csv", b"1,1,4\n", "csv",
                               movies_csv=b"movieId,title\n1," + _AMELIE + b"\n2," + _CAFE + b"\n"),
         ValueError, r"titles: .*movies\.csv, line 3: expected UTF-8 text \(MovieLens "
                     r"movies\.csv is UTF-8\), got the byte b'\\xe9'"),
    # files of one encoding read as before
    Case("titles-ml-1m-latin1", _titles("ratings.dat", _R1M, "ml-1m",
                                        movies_dat=b"1::" + _CAFE + b"::D\n2::Mis\xe9rables::D\n"),
         None, check=lambda t: t == ["Café (1995)", "Misérables"]),
    Case("titles-ml-100k-latin1", _titles("u.data", _R100K, "ml-100k",
                                          u_item=_item(1, _CAFE) + _item(2, b"Nausica\xe4")),
         None, check=lambda t: t == ["Café (1995)", "Nausicaä"]),
    # two high bytes side by side that are no UTF-8 sequence ('éè'): latin-1
    Case("titles-ml-1m-latin1-two-high-bytes",
         _titles("ratings.dat", b"1::1::4::0\n", "ml-1m", movies_dat=b"1::\xe9\xe8::D\n"),
         None, check=lambda t: t == ["éè"]),
    # a byte order mark before latin-1 text: no UTF-8 text, read as latin-1 (as before)
    Case("titles-ml-1m-bom-latin1",
         _titles("ratings.dat", b"1::1::4::0\n", "ml-1m", movies_dat=b"\xef\xbb\xbf1::" + _CAFE
                 + b"::D\n"),
         None, check=lambda t: t == ["Café (1995)"]),
    Case("titles-ml-10m-utf8", _titles("ratings.dat", _R1M, "ml-1m", movies_dat=b"1::" + _AMELIE
                                       + b"::D\n2::" + "Café".encode() + b"::D\n"),
         None, check=lambda t: t == ["Amélie (2001)", "Café"]),
    # MovieLens-1M's own accented titles (its movies.dat, latin-1: each accented letter one
    # byte before an ASCII one, no pair of them valid UTF-8) read as latin-1, titles and
    # genres alike; the same lines in UTF-8 (as -10M's movies.dat) read as UTF-8
    Case("titles-ml-1m-real-titles", _titles("ratings.dat", _ML1M_RATINGS, "ml-1m",
                                             movies_dat=_ML1M_MOVIES.encode("latin-1")),
         None, check=lambda t: t == _ML1M_TITLES),
    Case("item-features-ml-1m-real-titles",
         _files({"movies.dat": _ML1M_MOVIES.encode("latin-1")},
                lambda p: read_item_features(p / "movies.dat", "ml-1m",
                                             {k: k - 1 for k in range(1, 18)}).sum(0).tolist()),
         None, check=lambda g: g[0] == 17),  # Drama's column: every line's first genre
    Case("titles-ml-10m-real-titles", _titles("ratings.dat", _ML1M_RATINGS, "ml-1m",
                                              movies_dat=_ML1M_MOVIES.encode("utf-8")),
         None, check=lambda t: t == _ML1M_TITLES),
]


@pytest.mark.parametrize("case", _ENCODING_CASES, ids=[c.id for c in _ENCODING_CASES])
def test_an_item_or_user_file_of_two_encodings_is_refused(tmp_path, case):
    run_case(case, tmp_path)


# -- 2. movies.csv: physical lines, not records -------------------------------------------

_HEAD = b"movieId,title,genres\n"
_THREE_LINES = b'1,"A\nB\nC",Drama\n'  # one record on lines 2-4


def _csv_features(data: bytes) -> Callable[[Path], Any]:
    return _files({"movies.csv": data},
                  lambda p: read_item_features(p / "movies.csv", "csv", {1: 0, 2: 1}))


_CSV_LINE_CASES: List[Case] = [
    # 'line 3' for the record on line 5
    Case("titles-short-record", _titles("ratings.csv", b"1,1,4\n", "csv",
                                        movies_csv=_HEAD + _THREE_LINES + b"2\n"),
         ValueError, r"movies\.csv, line 5: expected movieId,title,\.\.\., got \['2'\]$"),
    Case("features-short-record", _csv_features(_HEAD + _THREE_LINES + b"2,B\n"), ValueError,
         r"movies\.csv, line 5: expected movieId,title,genres$"),
    Case("titles-repeated-id", _titles("ratings.csv", b"1,1,4\n", "csv",
                                       movies_csv=_HEAD + _THREE_LINES + b"\n1,D,Drama\n"),
         ValueError, r"movies\.csv, line 6: the item id 1 is listed again \(first on line 2\)"),
    # a record that starts on line 3 and ends on line 4: the line it starts on
    Case("features-empty-id", _csv_features(_HEAD + b'2,A,Drama\n ,"B\nC",Drama\n'),
         ValueError, r"movies\.csv, line 3: the item id must not be empty$"),
    Case("features-crlf", _csv_features(_HEAD.replace(b"\n", b"\r\n") + b'1,"A\r\nB",D\r\n2\r\n'),
         ValueError, r"movies\.csv, line 4: expected movieId,title,genres$"),
    # the title holding newlines reads as before
    Case("titles-newline-in-a-title", _titles("ratings.csv", b"1,1,4\n1,2,3\n", "csv",
                                              movies_csv=_HEAD + _THREE_LINES + b"2,D,Drama\n"),
         None, check=lambda t: t == ["A\nB\nC", "D"]),
]


@pytest.mark.parametrize("case", _CSV_LINE_CASES, ids=[c.id for c in _CSV_LINE_CASES])
def test_movies_csv_messages_give_the_physical_line(tmp_path, case):
    run_case(case, tmp_path)


# -- 2b. movies.csv: a record wider than the first line ---------------------------------

# an unquoted comma split a title: 'Foo, The (1995)' was the title 'Foo' and the genre
# ' The (1995)', silently; refused, as pandas' read_csv refuses a line wider than its first
_WIDE = (r"movies\.csv, line {}: expected at most {} fields, as the file's first line, got "
         r"4 in \['2', 'Foo', ' The \(1995\)', 'Drama'\]; a field holding a comma must be "
         r"quoted \('2,\"Foo, The \(1995\)\",Drama'\)")
_UNQUOTED = b"2,Foo, The (1995),Drama\n"

_CSV_WIDTH_CASES: List[Case] = [
    Case("titles-unquoted-comma", _titles("ratings.csv", b"1,1,4\n1,2,3\n", "csv",
                                          movies_csv=_HEAD + b"1,A,Drama\n" + _UNQUOTED),
         ValueError, _WIDE.format(3, 3) + r", or pass titles=False$"),
    Case("features-unquoted-comma", _csv_features(_HEAD + b"1,A,Drama\n" + _UNQUOTED),
         ValueError, _WIDE.format(3, 3) + "$"),
    Case("features-no-header", _csv_features(b"1,A,Drama\n" + _UNQUOTED), ValueError,
         _WIDE.format(2, 3) + "$"),
    # a quoted comma, and a file wider on every line (the header's columns), read as before
    Case("titles-quoted-comma", _titles("ratings.csv", b"1,1,4\n1,2,3\n", "csv",
                                        movies_csv=_HEAD + b'1,A,Drama\n2,"Foo, The (1995)",'
                                                           b'Drama\n'),
         None, check=lambda t: t == ["A", "Foo, The (1995)"]),
    Case("titles-wider-header", _titles("ratings.csv", b"1,1,4\n1,2,3\n", "csv",
                                        movies_csv=b"movieId,title,genres,year\n1,A,Drama,1995\n"
                                                   b"2,B,Comedy,1996\n"),
         None, check=lambda t: t == ["A", "B"]),
]


@pytest.mark.parametrize("case", _CSV_WIDTH_CASES, ids=[c.id for c in _CSV_WIDTH_CASES])
def test_movies_csv_record_wider_than_its_first_line_is_refused(tmp_path, case):
    run_case(case, tmp_path)


# -- 3. a lone '\r' past the first line ---------------------------------------------------

_CR = (r"it holds a '\\r' with no newline after it: a file whose lines end in '\\r' alone "
       r"\(classic Mac OS\) reads as one line; convert them to '\\n'$")


def _lone(line: int, quote: str) -> str:
    return rf"line {line}: expected lines ending in '\\n' \(or '\\r\\n'\), got {quote}; " + _CR


_CR_CASES: List[Case] = [
    # each read as user 2, item 20, rating 3, silently (user 3's rating lost)
    Case("text-3-cols", _ratings("r.txt", b"1 10 4\n2 20\r3 30\n", "text"), ValueError,
         _lone(2, r"'2 20\\r3 30'")),
    Case("text-4-cols", _ratings("r.txt", b"1 10 4 0\n2 20 3\r0\n", "text"), ValueError,
         _lone(2, r"'2 20 3\\r0'")),
    Case("text-crlf-then-cr", _ratings("r.txt", b"1 10 4\r\n5 50 1\r\n2 20\r3 30\r\n", "text"),
         ValueError, _lone(3, r"'2 20\\r3 30'")),
    # refused before too, as a field count or the separators: now with the cause
    Case("ml-1m", _ratings("r.dat", b"1::10::4::0\n2::20\r3::30\n", "ml-1m"), ValueError,
         _lone(2, r"'2::20\\r3::30'")),
    Case("csv-4-cols", _ratings("r.csv", b"1,10,4,0\n2,20\r3,30\n", "csv"), ValueError,
         _lone(2, r"'2,20\\r3,30'")),
    # the first of a lone '\r' and a wrong field count is named
    Case("cr-before-a-bad-count", _ratings("r.txt", b"1 10 4\n2 20\r3 30\n4\n", "text"),
         ValueError, _lone(2, r"'2 20\\r3 30'")),
    Case("bad-count-before-a-cr", _ratings("r.txt", b"1 10 4\n4\n2 20\r3 30\n", "text"),
         ValueError, r"line 2: expected 3 to 4 fields, got 1: '4'$"),
    # a Unicode space beside the '\r' (no space to the tokeniser, which splits at ASCII
    # whitespace): 'c\u2003\rd 3' read as user 'c\u2003', item 'd', rating 3, silently
    Case("text-unicode-space-before-a-cr",
         _ratings("r.txt", "a b 4\nc\u2003\rd 3\n".encode(), "text"), ValueError,
         _lone(2, r"'c\\u2003\\rd 3'")),
    Case("text-no-break-space-before-a-cr",
         _ratings("r.txt", "a b 4\nc d\u00a0\re f\n".encode(), "text"), ValueError,
         _lone(2, r"'c d\\xa0\\re f'")),
    Case("csv-no-break-space-before-a-cr",
         _ratings("r.csv", "1,10,4\n2,20,3\u00a0\r3,30,5\n".encode(), "csv"), ValueError,
         r"line 2: expected 3 fields, got 6: '2,20,3\\xa0\\r3,30,5'; the first line has 3 "
         r"fields; " + _CR),
    Case("bad-count-on-the-cr-line", _ratings("r.csv", b"1,10,4\n2,20,3\r3,30,5\n", "csv"),
         ValueError, r"line 2: expected 3 fields, got 6: '2,20,3\\r3,30,5'; the first line has "
                     r"3 fields; " + _CR),
    # read as before: a '\r' beside a separator or a space, CRLF, a last line's '\r'
    Case("cr-beside-a-separator", _ratings("r.csv", b"1,10,4\n2,20\r,3\n", "csv"), None,
         check=lambda r: r.rating.tolist() == [4.0, 3.0]),
    Case("cr-beside-a-space", _ratings("r.txt", b"1 10 4\n2 20 \r3\n", "text"), None,
         check=lambda r: r.rating.tolist() == [4.0, 3.0]),
    Case("crlf-and-a-last-cr", _ratings("r.txt", b"1 10 4\r\n2 20 3\r\n\r\n3 30 5\r", "text"),
         None, check=lambda r: r.rating.tolist() == [4.0, 3.0, 5.0]),
]


@pytest.mark.parametrize("case", _CR_CASES, ids=[c.id for c in _CR_CASES])
def test_a_lone_carriage_return_on_any_line_is_named(tmp_path, case):
    run_case(case, tmp_path)


# -- 4. a string id that is no UTF-8: its byte in its line ----------------------------------

def _not_utf8(line: int, what: str, reason: str, byte: int, token: str) -> str:
    return (rf"line {line}: the {what} id is not UTF-8 text \({reason} at byte {byte} of the "
            rf"line\): b'{token}'; the file must be UTF-8 encoded")


_ID_CASES: List[Case] = [
    # 'at byte 3' (of the id) for byte 7 of the line
    Case("csv-item-id", _ratings("r.csv", b"u,i,r\nabc,jos\xe9,4\n", "csv"), ValueError,
         _not_utf8(2, "item", "unexpected end of data", 7, r"jos\\xe9")),
    Case("text-spaces", _ratings("r.txt", b"a b 4\nuser   x\xe9y 3\n", "text"), ValueError,
         _not_utf8(2, "item", "invalid continuation byte", 8, r"x\\xe9y")),
    Case("text-crlf-third-line", _ratings("r.txt", b"a b 4\r\nc d 3\r\nee\t\tf\xe9 2\r\n"),
         ValueError, _not_utf8(3, "item", "unexpected end of data", 5, r"f\\xe9")),
    # a byte order mark is no part of the first line
    Case("bom-user-id", _ratings("r.txt", b"\xef\xbb\xbfjos\xe9 a 4\n"), ValueError,
         _not_utf8(1, "user", "unexpected end of data", 3, r"jos\\xe9")),
]


@pytest.mark.parametrize("case", _ID_CASES, ids=[c.id for c in _ID_CASES])
def test_an_id_that_is_no_utf8_names_its_byte_in_the_line(tmp_path, case):
    run_case(case, tmp_path)


# -- 5. the benchmarks use the public API ----------------------------------------------------

@pytest.mark.parametrize("script", ["bench_models.py"])
def test_a_benchmark_imports_no_private_nnsparse_name(script):
    """bench_models imported the readers' private _path and _title_file."""
    tree = ast.parse(Path(ROOT, "benchmarks", script).read_text())
    private = [(node.module, alias.name) for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nnsparse")
               for alias in node.names
               if alias.name.startswith("_") or any(part.startswith("_")
                                                    for part in node.module.split("."))]
    assert private == []


def test_bench_models_looks_for_the_item_file_read_ratings_reads():
    """bench_models names each format's item file itself (no private import): the names
    read_ratings takes titles from, for every format that has one."""
    import bench_models
    from nnsparse.data import FORMATS
    from nnsparse.data.readers import _FORMATS
    assert bench_models._ITEM_FILES == {f: _FORMATS[f][3] for f in FORMATS if _FORMATS[f][3]}
