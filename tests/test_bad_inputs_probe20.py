"""The twentieth bad-input probe (docs/bad_inputs_probe20.md): session 21's changes (the
compile boundary, the Lua names, the rewritten rating reader, the divergence check).

Rating files with a NUL byte past the first 4096 bytes (numpy's bytes arrays dropped a
token's trailing NULs: read silently as another id or rating); refusals of a UTF-8 rating
file quoted as latin-1 (``'2Ã©0'``); a zip archive given as ``titles=`` read as text; a
csv header alone called an empty file; lines ending in a lone ``\r`` with no word why.

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result).
"""
from pathlib import Path
from typing import Any, Callable, List

import pytest

from probe_cases import Case, run_case
from nnsparse.data import (Ratings, detect_format, read_item_features, read_ratings,
                           read_split, read_user_features)

# 400 distinct ratings (4.8 KB): what follows lies past the first 4096 bytes, which the
# binary check reads
_MANY = b"".join(b"%d::10::4::1\n" % u for u in range(400))
_MANY_TEXT = b"".join(b"u%d i 4\n" % u for u in range(800))
_MANY_CSV = b"".join(b"%d,10,4\n" % u for u in range(800))


def _read(name: str, data: bytes, **kwargs: Any) -> Callable[[Path], Ratings]:
    """A call reading ``data`` written to ``tmp_path / name``."""
    def call(tmp_path: Path) -> Ratings:
        path = tmp_path / name
        path.write_bytes(data)
        return read_ratings(path, **kwargs)
    return call


def _nul(line: int) -> str:
    return rf"line {line}: a NUL byte \(\\x00\), which no text file holds, got "


_NUL_CASES: List[Case] = [
    # (the rows read as 3 and 20 before: same ratings and ids as without the NUL)
    Case("rating-trailing-nul", _read("r.dat", _MANY + b"999::20::3\x00::1\n"), ValueError,
         _nul(401) + r"'999::20::3\\x00::1'; save the file as UTF-8 text"),
    Case("item-trailing-nul", _read("r.dat", _MANY + b"999::20\x00::3::1\n"), ValueError,
         _nul(401) + r"'999::20\\x00::3::1'"),
    # user 99's id merged with the 99 of line 100, silently
    Case("user-merged-with-another", _read("r.dat", _MANY + b"99\x00::20::3::1\n"), ValueError,
         _nul(401)),
    Case("timestamp-nul", _read("r.dat", _MANY + b"999::20::3::\x00\n"), ValueError,
         _nul(401)),
    Case("text-id", _read("r.txt", _MANY_TEXT + b"a\x00 c 3\n"), ValueError,
         _nul(801) + r"'a\\x00 c 3'"),
    Case("text-rating", _read("r.txt", _MANY_TEXT + b"a c 3\x00\n"), ValueError, _nul(801)),
    Case("csv-id", _read("r.csv", _MANY_CSV + b"9999,10\x00,3\n"), ValueError,
         _nul(801) + r"'9999,10\\x00,3'"),
    Case("explicit-format", _read("r.dat", _MANY + b"999::20::3\x00::1\n", format="ml-1m"),
         ValueError, _nul(401)),
    Case("last-line-no-newline", _read("r.dat", _MANY + b"999::20::3::1\x00"), ValueError,
         _nul(401)),
    # a NUL in the first 4096 bytes: the same wording, which says so
    Case("head-nul", _read("r.dat", b"1::10::4\x00::1\n"), ValueError,
         _nul(1) + r"'1::10::4\\x00::1' \(in its first 4096 bytes: a binary file or UTF-16 "
         r"text"),
    # without a NUL the same file reads (the reference)
    Case("no-nul", _read("r.dat", _MANY + b"999::20::3::1\n"), None,
         check=lambda r: len(r.rating) == 401 and 999 in r.user_map),
]


@pytest.mark.parametrize("case", _NUL_CASES, ids=[c.id for c in _NUL_CASES])
def test_a_nul_past_the_head_is_refused_with_its_line(tmp_path, case):
    run_case(case, tmp_path)


def _nul_message(name: str, file: str, line: int, quote: str, head: bool) -> str:
    """The one wording of a NUL byte's refusal (two before: "holds NUL bytes: ..." for the
    first 4096 bytes, "a NUL byte (\x00), which ..." past them), whole."""
    where = (r" \(in its first 4096 bytes: a binary file or UTF-16 text, not ASCII, UTF-8 or "
             r"latin-1 text\)" if head else "")
    return (rf"^{name}: .*{file}, line {line}: a NUL byte \(\\x00\), which no text file "
            rf"holds, got '{quote}'{where}; save the file as UTF-8 text$")


# 400 lines of 11 bytes: byte 4095 is the 4th character of line 373, byte 4096 its 5th
_ELEVEN = b"".join(b"u%05d i 4\n" % u for u in range(400))


def _nul_at(at: int) -> bytes:
    return _ELEVEN[:at] + b"\x00" + _ELEVEN[at + 1:]


def _side(name: str, data: bytes, reader: Callable[..., Any], fmt: str
          ) -> Callable[[Path], Any]:
    def call(tmp_path: Path) -> Any:
        path = tmp_path / name
        path.write_bytes(data)
        return reader(path, fmt, {1: 0})
    return call


def _titles_from(data: bytes) -> Callable[[Path], Any]:
    def call(tmp_path: Path) -> Any:
        (tmp_path / "ratings.dat").write_bytes(b"1::1::4::1\n")
        (tmp_path / "movies.dat").write_bytes(data)
        return read_ratings(tmp_path / "ratings.dat").titles
    return call


def _csv_titles_from(data: bytes) -> Callable[[Path], Any]:
    def call(tmp_path: Path) -> Any:
        (tmp_path / "ratings.csv").write_bytes(b"1,1,4\n")
        (tmp_path / "movies.csv").write_bytes(data)
        return read_ratings(tmp_path / "ratings.csv").titles
    return call


# 400 item or user lines (ids 2 to 401: more than 4096 bytes) before the one of id 1
_MOVIES_DAT = b"".join(b"%d::T::Comedy\n" % i for i in range(2, 402))
_MOVIES_CSV = b"movieId,title,genres\n" + b"".join(b"%d,T,Comedy\n" % i for i in range(2, 402))
_U_ITEM = b"".join(b"%d|T|d||u|1|0\n" % i for i in range(2, 402))
_U_USER = b"".join(b"%d|24|F|writer|55105\n" % i for i in range(2, 402))


def _detect(data: bytes) -> Callable[[Path], str]:
    def call(tmp_path: Path) -> str:
        path = tmp_path / "r.dat"
        path.write_bytes(data)
        return detect_format(path)
    return call


_ONE_NUL_WORDING: List[Case] = [
    # in the first 4096 bytes (a binary file or UTF-16 text, likely): its line too now
    Case("ratings-head", _read("r.dat", b"1::10::4::1\n2::20\x00::3::1\n"), ValueError,
         _nul_message("path", r"r\.dat", 2, r"2::20\\x00::3::1", head=True)),
    Case("ratings-byte-4095", _read("r.txt", _nul_at(4095)), ValueError,
         _nul_message("path", r"r\.txt", 373, r"u00\\x0072 i 4", head=True)),
    # past them: the same wording, without the binary-file clause
    Case("ratings-byte-4096", _read("r.txt", _nul_at(4096)), ValueError,
         _nul_message("path", r"r\.txt", 373, r"u003\\x002 i 4", head=False)),
    Case("ratings-past-the-head", _read("r.dat", _MANY + b"999::20\x00::3::1\n"), ValueError,
         _nul_message("path", r"r\.dat", 401, r"999::20\\x00::3::1", head=False)),
    Case("detect-format", _detect(b"1::10::4\x00::1\n"), ValueError,
         _nul_message("path", r"r\.dat", 1, r"1::10::4\\x00::1", head=True)),
    Case("item-features", _side("movies.dat", b"1::A::Drama\n2::B\x00::Drama\n",
                                read_item_features, "ml-1m"), ValueError,
         _nul_message("path", r"movies\.dat", 2, r"2::B\\x00::Drama", head=True)),
    Case("user-features", _side("u.user", b"1|24|M|x\x00|85711\n", read_user_features,
                                "ml-100k"), ValueError,
         _nul_message("path", r"u\.user", 1, r"1\|24\|M\|x\\x00\|85711", head=True)),
    Case("titles", _titles_from(b"1::A\x00::Drama\n"), ValueError,
         _nul_message("titles", r"movies\.dat", 1, r"1::A\\x00::Drama", head=True)),
    # past them in an item or user file (read whole, as text): refused too; 'Dra\0ma' was
    # a genre of its own, 'writ\0er' an occupation (a feature column each), silently
    Case("item-ml-1m-past-the-head", _side("movies.dat", _MOVIES_DAT + b"1::A::Dra\x00ma\n",
                                           read_item_features, "ml-1m"), ValueError,
         _nul_message("path", r"movies\.dat", 401, r"1::A::Dra\\x00ma", head=False)),
    Case("item-csv-past-the-head", _side("movies.csv", _MOVIES_CSV + b"1,A,Dra\x00ma\n",
                                         read_item_features, "csv"), ValueError,
         _nul_message("path", r"movies\.csv", 402, r"1,A,Dra\\x00ma", head=False)),
    Case("item-ml-100k-past-the-head", _side("u.item", _U_ITEM + b"1|A|d||u|0|1\x00\n",
                                             read_item_features, "ml-100k"), ValueError,
         _nul_message("path", r"u\.item", 401, r"1\|A\|d\|\|u\|0\|1\\x00", head=False)),
    Case("user-past-the-head", _side("u.user", _U_USER + b"1|24|M|writ\x00er|55105\n",
                                     read_user_features, "ml-100k"), ValueError,
         _nul_message("path", r"u\.user", 401, r"1\|24\|M\|writ\\x00er\|55105", head=False)),
    Case("titles-past-the-head", _titles_from(_MOVIES_DAT + b"1::A\x00::Drama\n"), ValueError,
         _nul_message("titles", r"movies\.dat", 401, r"1::A\\x00::Drama", head=False)),
    Case("titles-csv-past-the-head", _csv_titles_from(_MOVIES_CSV + b"1,A\x00,Drama\n"),
         ValueError, _nul_message("titles", r"movies\.csv", 402, r"1,A\\x00,Drama",
                                  head=False)),
    Case("utf-16", _read("r.dat", "1::10::4::1\n".encode("utf-16-le")), ValueError,
         _nul_message("path", r"r\.dat", 1, r"1\\x00:\\x00:.*", head=True)),
    # the references: no NUL, no refusal
    Case("no-nul-4096", _read("r.txt", _ELEVEN), None, check=lambda r: len(r.rating) == 400),
    Case("no-nul-detect", _detect(b"1::10::4::1\n"), None, check=lambda f: f == "ml-1m"),
    Case("no-nul-item", _side("movies.dat", _MOVIES_DAT + b"1::A::Drama\n", read_item_features,
                              "ml-1m"), None, check=lambda f: f.tolist() == [[0.0, 1.0]]),
    Case("no-nul-item-csv", _side("movies.csv", _MOVIES_CSV + b"1,A,Drama\n",
                                  read_item_features, "csv"), None,
         check=lambda f: f.tolist() == [[0.0, 1.0]]),
    Case("no-nul-user", _side("u.user", _U_USER + b"1|24|M|writer|55105\n", read_user_features,
                              "ml-100k"), None, check=lambda f: f[0, 0].item() == 0.0),
    Case("no-nul-titles", _titles_from(_MOVIES_DAT + b"1::A::Drama\n"), None,
         check=lambda t: t == ["A"]),
    Case("no-nul-titles-csv", _csv_titles_from(_MOVIES_CSV + b"1,A,Drama\n"), None,
         check=lambda t: t == ["A"]),
]


@pytest.mark.parametrize("case", _ONE_NUL_WORDING, ids=[c.id for c in _ONE_NUL_WORDING])
def test_a_nul_byte_is_refused_in_one_wording_wherever_it_lies(tmp_path, case):
    run_case(case, tmp_path)


def test_read_split_refuses_a_nul_in_either_part(tmp_path):
    train, test = tmp_path / "a.dat", tmp_path / "b.dat"
    train.write_bytes(_MANY)
    test.write_bytes(_MANY + b"999::20\x00::3::1\n")
    with pytest.raises(ValueError, match=r"b\.dat, line 401: a NUL byte"):
        read_split(train, test)
    with pytest.raises(ValueError, match=r"b\.dat, line 401: a NUL byte"):
        read_split(test, train)  # (the training part: read first)


_UTF8_CASES: List[Case] = [
    Case("item-id", _read("r.dat", "1::10::4::1\n2::2\u00e90::3::1\n".encode()), ValueError,
         r"line 2: the item id must be an integer, got '2\u00e90'"),
    Case("rating-star", _read("r.dat", "1::10::4\u2605::1\n".encode()), ValueError,
         r"the rating must be a finite number, got '4\u2605'"),
    Case("text-rating", _read("r.txt", "a b 4\u2605\n".encode()), ValueError,
         r"the rating must be a finite number, got '4\u2605'"),
    Case("underscore", _read("r.dat", "1::1_\u00e9::4::1\n".encode()), ValueError,
         r"the item id must be an integer, got '1_\u00e9' \(no '_' in numbers\)"),
    Case("field-count", _read("r.dat", "1::10::4::1\n2::\u00e9::3\n".encode()), ValueError,
         r"expected 4 fields, got 3: '2::\u00e9::3'"),
    Case("csv-quotes", _read("r.csv", 'userId,movieId,rating\n1,"\u00e9",4\n'.encode()),
         ValueError, r"reads fields without quotes, got '1,\"\u00e9\",4'"),
    Case("csv-edge-separator", _read("r.csv", "userId,movieId,rating\n1,\u00e9,4,\n".encode()),
         ValueError, r"\(an empty field\), got '1,\u00e9,4,'"),
    Case("whitespace-separated", _read("r.dat", "1::10::4::1\n1 \u00e9 4 1\n".encode(),
                                       format="ml-1m"),
         ValueError, r"separates the fields with '::', got '1 \u00e9 4 1'"),
    Case("other-format-hint", _read("u.data", "1\t10\t4\t1\n1::\u00e9::4::1\n".encode(),
                                    format="ml-100k"),
         ValueError, r"expected 4 fields, got 1: '1::\u00e9::4::1'"),
    # a latin-1 byte, no UTF-8: quoted as latin-1, as before
    Case("latin-1-id", _read("r.dat", b"1::10::4::1\n2::2\xe90::3::1\n"), ValueError,
         r"got '2\u00e90'"),
]


@pytest.mark.parametrize("case", _UTF8_CASES, ids=[c.id for c in _UTF8_CASES])
def test_a_utf8_rating_file_is_quoted_as_written(tmp_path, case):
    run_case(case, tmp_path)


def test_detect_format_quotes_a_utf8_first_line(tmp_path):
    path = tmp_path / "r.txt"
    path.write_bytes("1,\u00e9,2,3,4,5\n".encode())
    with pytest.raises(ValueError, match="its first line '1,\u00e9,2,3,4,5' has 6 comma"):
        detect_format(path)


def _zip(path: Path) -> Path:
    import zipfile
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ml-1m/movies.dat", "10::A (1995)::Drama\n")
    return path


def _gzip(path: Path) -> Path:
    path.write_bytes(b"\x1f\x8b\x08\x00rest")
    return path


@pytest.mark.parametrize("make, match", [
    (_zip, r"titles: .*movies\.zip is a zip archive \(it starts with b'PK\\x03\\x04'\), not "
           r"a text file; extract it and give the item file in it$"),
    (_gzip, r"titles: .*movies\.zip is gzip-compressed"),
    (lambda p: (p.write_bytes(b"10::A\x00::Drama\n"), p)[1],
     r"titles: .*movies\.zip, line 1: a NUL byte \(\\x00\), which no text file holds"),
], ids=["zip", "gzip", "nul"])
def test_a_binary_titles_file_is_named(tmp_path, make, match):
    """A zip given as titles= was read as text: 'the item id must be an integer, got
    'PK\\x03\\x04\\x14...''."""
    ratings = tmp_path / "ratings.dat"
    ratings.write_bytes(b"1::10::4::1\n")
    with pytest.raises(ValueError, match=match):
        read_ratings(ratings, titles=make(tmp_path / "movies.zip"))


_ZIP_ADVICE = r"m\.zip is a zip archive .*; extract it and give the {} file in it$"
_SIDE_CASES: List[Case] = [
    # a zip was told to 'give the rating file in it (e.g. ml-1m/ratings.dat)'
    Case("item-ml-1m-zip", lambda p: read_item_features(_zip(p / "m.zip"), "ml-1m", {10: 0}),
         ValueError, r"path: .*" + _ZIP_ADVICE.format("item")),
    Case("user-ml-1m-zip", lambda p: read_user_features(_zip(p / "m.zip"), "ml-1m", {1: 0}),
         ValueError, r"path: .*" + _ZIP_ADVICE.format("user")),
    # a movies.csv zip or gzip raised the codec's UnicodeDecodeError ("can't decode byte")
    Case("item-csv-zip", lambda p: read_item_features(_zip(p / "m.zip"), "csv", {10: 0}),
         ValueError, _ZIP_ADVICE.format("item")),
    Case("item-csv-gzip", lambda p: read_item_features(_gzip(p / "m.gz"), "csv", {10: 0}),
         ValueError, r"m\.gz is gzip-compressed \(it starts with b'\\x1f\\x8b'\), not a text "
                     r"file; decompress it first \(gunzip\)$"),
]


@pytest.mark.parametrize("case", _SIDE_CASES, ids=[c.id for c in _SIDE_CASES])
def test_a_binary_item_or_user_file_is_named_as_such(tmp_path, case):
    run_case(case, tmp_path)


def test_titles_of_text_still_read(tmp_path):
    """The reference: a UTF-8 movies.dat with a BOM and CRLF given as titles= reads."""
    ratings = tmp_path / "ratings.dat"
    ratings.write_bytes(b"1::10::4::1\n")
    (tmp_path / "m.dat").write_bytes("\ufeff10::Mis\u00e9rables (1995)::Drama\r\n".encode())
    assert read_ratings(ratings, titles=tmp_path / "m.dat").titles == ["Mis\u00e9rables (1995)"]


_HEADER_CASES: List[Case] = [
    # 'holds no ratings (empty file)' for a file that holds a line
    Case("header-only", _read("r.csv", b"userId,movieId,rating,timestamp\n"), ValueError,
         r"r\.csv holds no ratings \(a header line and no rating line\)"),
    Case("header-blank-lines", _read("r.csv", b"\xef\xbb\xbfuser,item,rating\r\n\r\n\n"),
         ValueError, r"holds no ratings \(a header line and no rating line\)"),
    Case("header-only-explicit", _read("r.csv", b"user,item,rating\n", format="csv"),
         ValueError, r"holds no ratings \(a header line and no rating line\)"),
    Case("empty", _read("r.csv", b"\n\n", format="csv"), ValueError,
         r"holds no ratings \(empty file\)"),
    Case("header-and-a-rating", _read("r.csv", b"user,item,rating\n1,2,3\n"), None,
         check=lambda r: r.rating.tolist() == [3.0]),
]


@pytest.mark.parametrize("case", _HEADER_CASES, ids=[c.id for c in _HEADER_CASES])
def test_a_header_only_file_is_not_called_empty(tmp_path, case):
    run_case(case, tmp_path)


_CR = r"it holds a '\\r' with no newline after it: a file whose lines end in '\\r' alone"
_CR_CASES: List[Case] = [
    # 'expected 3 to 4 fields, got 2' of what an editor shows as two lines, no word why
    Case("cr-only-auto", _read("r.dat", b"1::10::4::100\r2::20::3::101\r"), ValueError,
         r"line 1: expected 3 to 4 fields, got 2: '1::10::4::100\\r2::20::3::101'; " + _CR),
    Case("cr-only-ml-1m", _read("r.dat", b"1::10::4::100\r2::20::3::101\r", format="ml-1m"),
         ValueError, r"expected 4 fields, got 8: .*; " + _CR),
    Case("cr-only-csv", _read("r.csv", b"1,10,4\r2,20,3\r", format="csv"), ValueError, _CR),
    # no hint where the '\r' is not the cause: a stray '\r' beside a separator, a CRLF
    # line's (stripped)
    Case("cr-too-few-fields", _read("r.dat", b"1::10::4::1\n1::10\r::4\n", format="ml-1m"),
         ValueError, r"line 2: expected 4 fields, got 3: '1::10\\r::4'$"),
    Case("crlf-too-few-fields", _read("r.dat", b"1::10::4::1\r\n1::10::4\r\n", format="ml-1m"),
         ValueError, r"line 2: expected 4 fields, got 3: '1::10::4'$"),
    # CRLF and a last line ending in a lone \r read as before
    Case("crlf-and-final-cr", _read("r.dat", b"1::10::4::1\r\n2::20::3::1\n3::30::5::1\r"), None,
         check=lambda r: r.rating.tolist() == [4.0, 3.0, 5.0]),
    # 3 or 4 lines of no whitespace are one 'text' line of 3 or 4 fields: the field count
    # passed and the 'rating' '3::30::5::102' failed with no word of the '\r'
    Case("cr-only-auto-3-lines", _read("r.dat", b"1::10::4::100\r2::20::3::101\r3::30::5::102\r"),
         ValueError, r"r\.dat, line 1: expected lines ending in '\\n' \(or '\\r\\n'\), got "
                     r"'1::10::4::100\\r2::20::3::101\\r3::30::5::102'; " + _CR + r".* \(format "
                     r"'auto' read r\.dat as 'text', from its first line"),
    Case("cr-only-auto-4-lines", _read("r.dat", b"1::10::4::1\r2::20::3::1\r3::30::5::1\r"
                                                b"4::40::1::1"),
         ValueError, r"line 1: expected lines ending in '\\n' \(or '\\r\\n'\), got "
                     r"'1::10::4::1\\r2::20::3::1\\r3::30::5::1\\r4::40::1::1'; " + _CR),
    Case("cr-only-auto-csv-3-lines", _read("r.csv", b"1,10,4\r2,20,3\r3,30,5\r"), ValueError,
         r"line 1: expected lines ending in .*; " + _CR),
    Case("cr-only-auto-csv-header-2-lines", _read("r.csv", b"u,i,r\r1,10,4\r2,20,3\r"),
         ValueError, r"line 1: expected lines ending in .*'u,i,r\\r1,10,4\\r2,20,3'; " + _CR),
    Case("cr-only-text-3-lines", _read("r.txt", b"a\rb\rc\r", format="text"), ValueError,
         r"line 1: expected lines ending in '\\n' \(or '\\r\\n'\), got 'a\\rb\\rc'; " + _CR
         + r" .*convert them to '\\n'$"),
    # one line, its break a lone '\r' or none, reads as before
    Case("one-line-cr-ml-1m", _read("r.dat", b"1::10::4::100\r"), None,
         check=lambda r: r.rating.tolist() == [4.0]),
    Case("one-line-cr-csv", _read("r.csv", b"1,10,4\r"), None,
         check=lambda r: r.rating.tolist() == [4.0]),
    Case("one-line-cr-text", _read("r.txt", b"a b 4 100\r"), None,
         check=lambda r: r.user_map == {"a": 0} and r.rating.tolist() == [4.0]),
    Case("one-line-no-break", _read("r.txt", b"a b 4"), None,
         check=lambda r: r.rating.tolist() == [4.0]),
    Case("crlf-3-lines", _read("r.dat", b"1::10::4::1\r\n2::20::3::1\r\n3::30::5::1\r\n"), None,
         check=lambda r: r.rating.tolist() == [4.0, 3.0, 5.0]),
]


@pytest.mark.parametrize("case", _CR_CASES, ids=[c.id for c in _CR_CASES])
def test_lines_ending_in_a_lone_carriage_return_are_named(tmp_path, case):
    run_case(case, tmp_path)
