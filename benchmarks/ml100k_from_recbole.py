"""Rebuild MovieLens-100K's files from the copy RecBole's wheel ships, for real-data runs.

RecBole (PyPI ``recbole``) ships the 100,000 ratings of MovieLens-100K's
``u.data``, in their original line order, as
``recbole/dataset_example/ml-100k/ml-100k.inter``, with the item and user
tables.  This script writes, in MovieLens's own formats:

* ``u.data`` (``user<TAB>item<TAB>rating<TAB>timestamp``);
* the canonical five-fold splits ``u1.base`` / ``u1.test`` ... ``u5``, by
  MovieLens's ``mku.sh`` rule: ``uN.test`` is lines ``20000 (N-1) + 1`` to
  ``20000 N`` of ``u.data``, ``uN.base`` the other lines, both sorted by user
  then item;
* ``u.item`` (title with year, the 19 genre flags CFN++ reads) and
  ``u.user`` (age, gender, occupation, zip code).

Run (no network is needed once the wheel is on disk)::

    pip download recbole==1.2.1 --no-deps -d /tmp/recbole
    python benchmarks/ml100k_from_recbole.py /tmp/recbole/recbole-1.2.1-py3-none-any.whl ml-100k/
    python examples/movielens_autoencoder.py --folds ml-100k/ --format ml-100k
"""
from __future__ import annotations

import argparse
import os
import zipfile
from typing import List, Tuple

_PREFIX = "recbole/dataset_example/ml-100k/ml-100k."
# MovieLens-100K's genre columns, in u.item's order
GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
          "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
          "Romance", "Sci-Fi", "Thriller", "War", "Western")
FOLD = 20_000


def _table(wheel: zipfile.ZipFile, kind: str) -> List[List[str]]:
    """The rows of RecBole's atomic file ``ml-100k.<kind>``, header dropped."""
    text = wheel.read(_PREFIX + kind).decode("utf-8")
    return [line.split("\t") for line in text.splitlines()[1:] if line]


def _key(line: str) -> Tuple[int, int]:
    user, item = line.split("\t")[:2]
    return int(user), int(item)


def _write(path: str, lines: List[str], encoding: str = "utf-8") -> None:
    with open(path, "w", encoding=encoding, errors="replace", newline="\n") as f:
        f.write("".join(line + "\n" for line in lines))


def _item_line(row: List[str]) -> str:
    item, title, year = row[0], row[1], row[2] if len(row) > 2 else ""
    genres = set(row[3].split(" ")) if len(row) > 3 and row[3] else set()
    unknown = genres - set(GENRES)
    if unknown:
        raise ValueError(f"item {item}: genres {sorted(unknown)} are not MovieLens-100K's")
    flags = ["1" if g in genres else "0" for g in GENRES]
    return "|".join([item, f"{title} ({year})" if year else title, "", "", ""] + flags)


def convert(wheel_path: str, out: str) -> int:
    """Write the files into ``out``; returns the number of ratings."""
    with zipfile.ZipFile(wheel_path) as wheel:
        ratings = ["\t".join(r[:4]) for r in _table(wheel, "inter")]
        items = [_item_line(r) for r in _table(wheel, "item")]
        users = ["|".join(r[:5]) for r in _table(wheel, "user")]
    if len(ratings) % FOLD:
        raise ValueError(f"{wheel_path}: {len(ratings)} ratings, not a multiple of {FOLD} "
                         "(MovieLens-100K has 100,000)")
    os.makedirs(out, exist_ok=True)
    _write(os.path.join(out, "u.data"), ratings)
    for n in range(1, len(ratings) // FOLD + 1):
        lo, hi = (n - 1) * FOLD, n * FOLD
        _write(os.path.join(out, f"u{n}.test"), sorted(ratings[lo:hi], key=_key))
        _write(os.path.join(out, f"u{n}.base"), sorted(ratings[:lo] + ratings[hi:], key=_key))
    _write(os.path.join(out, "u.item"), items, encoding="latin-1")  # MovieLens's encoding
    _write(os.path.join(out, "u.user"), users)
    return len(ratings)


def main(argv: List[str] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("wheel", help="recbole-*.whl (pip download recbole --no-deps)")
    p.add_argument("out", help="the directory to write u.data, u1.base ... into")
    args = p.parse_args(argv)
    n = convert(args.wheel, args.out)
    print(f"{n} ratings -> {args.out}: u.data, u1..u{n // FOLD}.base/.test, u.item, u.user")


if __name__ == "__main__":
    main()
