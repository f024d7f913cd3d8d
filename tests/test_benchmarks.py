"""The benchmark scripts still run: every configuration of bench_autoencoder on a tiny shape.

Timings are not checked (never in a test); a configuration that raises
prints ``failed`` in its row, which is what this catches.
"""
import math
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_autoencoder_every_configuration_runs():
    script = os.path.join(ROOT, "benchmarks", "bench_autoencoder.py")
    configs = ["dense-masked", "nns-default", "nns-lazyadam", "nns-in-backward",
               "nns-rowwise-adagrad"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, script, "--shape", "tiny", "--steps", "1",
                           "--warmup", "1", "--threads", "1", "--configs", *configs],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines()
            if line.split() and line.split()[0] in configs}
    assert set(rows) == set(configs), done.stdout
    failed = [line for line in rows.values() if "failed" in line]
    assert not failed, done.stdout


def test_bench_row_update_runs():
    script = os.path.join(ROOT, "benchmarks", "bench_row_update.py")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, script, "--rows", "200", "--width", "8",
                           "--threads", "1", "--repeat", "1"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    shares = [line for line in lines if len(line) == 3 and line[0].startswith("0.")]
    assert len(shares) == 2 * 8, done.stdout  # a row per share, for both kinds


def test_bench_optimisers_runs():
    script = os.path.join(ROOT, "benchmarks", "bench_optimisers.py")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, script, "--users", "60", "--items", "40",
                           "--ratings", "800", "--epochs", "2", "--hidden", "4",
                           "--adam-lrs", "1e-3", "--lrs", "3e-3"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    names = [line.split()[0] for line in done.stdout.splitlines()[2:] if line.split()]
    assert names == ["adam-0.001", "in-backward-adam-0.001", "rowwise-adagrad-0.003"], \
        done.stdout


def test_bench_lbfgs_lowers_the_models_objective():
    """Full-batch L-BFGS on KernelNet.batch_loss: each checkpoint's objective is lower than
    the last, and the test RMSE is a real score."""
    import bench_lbfgs
    from nnsparse.data import split_ratings, synthetic_ratings
    from nnsparse.models import KernelNet
    train, test = split_ratings(synthetic_ratings(0, 60, 80, 1_500), 0.2, seed=0)
    model = KernelNet(hidden=8, l2=1.0, l2_kernel=0.001)
    rows = bench_lbfgs.train_lbfgs(model, train, test, rounds=3, iters=4, every=1)
    assert [r for r, *_ in rows] == [1, 2, 3]
    losses = [loss for _, loss, _, _ in rows]
    assert losses[0] > losses[1] > losses[2], losses
    assert all(0 < rmse < 4 for _, _, rmse, _ in rows), rows


@pytest.mark.parametrize("first_line, message", [
    ("1,2\n", "has 2 comma-separated fields"),  # (3 fields, '1,2,3', read as csv now)
    (None, "no rating file at"),
])
def test_bench_lbfgs_unreadable_files_are_a_usage_error(tmp_path, capsys, first_line, message):
    """A file --format auto cannot detect, or no file, is argparse's error (exit 2) naming
    the flags, not a traceback."""
    import bench_lbfgs
    train = tmp_path / "train.csv"
    if first_line is not None:
        train.write_text(first_line)
    with pytest.raises(SystemExit) as stop:
        bench_lbfgs.main(["--train", str(train), "--test", str(train)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "error: cannot read --train/--test: " in err and message in err, err


def test_bench_lbfgs_reports_the_objective_after_each_round():
    """The objective printed for round r is the one its iterations reached, not the one
    the round started from (torch's LBFGS.step returns the loss of its first evaluation)."""
    import bench_lbfgs
    from nnsparse.data import split_ratings, synthetic_ratings
    from nnsparse.models import KernelNet
    train, test = split_ratings(synthetic_ratings(0, 60, 80, 1_500), 0.2, seed=0)
    fresh = KernelNet(hidden=8, l2=1.0, l2_kernel=0.001)
    x = fresh._prepare(train, train.scale, None)  # the initialisation train_lbfgs starts from
    with torch.no_grad():
        start = float(fresh.batch_loss(torch.arange(x.shape[0]), x))
    model = KernelNet(hidden=8, l2=1.0, l2_kernel=0.001)
    rows = bench_lbfgs.train_lbfgs(model, train, test, rounds=2, iters=4, every=1)
    assert rows[0][1] < start, (rows, start)
    model.train()
    with torch.no_grad():
        end = float(model.batch_loss(torch.arange(x.shape[0]), model._input))
    assert rows[-1][1] == pytest.approx(end, rel=1e-6), (rows, end)


def test_bench_lbfgs_scipy_lowers_the_same_objective():
    """--scipy: each round is one call of scipy's L-BFGS-B (the papers' optimiser) on the
    same objective; it falls round after round, and the weights it leaves are the model's."""
    pytest.importorskip("scipy")
    import bench_lbfgs
    from nnsparse.data import split_ratings, synthetic_ratings
    from nnsparse.models import KernelNet
    train, test = split_ratings(synthetic_ratings(0, 60, 80, 1_500), 0.2, seed=0)
    fresh = KernelNet(hidden=8, l2=1.0, l2_kernel=0.001)
    x = fresh._prepare(train, train.scale, None)
    with torch.no_grad():
        start = float(fresh.batch_loss(torch.arange(x.shape[0]), x))
    model = KernelNet(hidden=8, l2=1.0, l2_kernel=0.001)
    rows = bench_lbfgs.train_lbfgs(model, train, test, rounds=3, iters=4, every=1, scipy=True)
    losses = [loss for _, loss, _, _ in rows]
    assert start > losses[0] > losses[1] > losses[2], (start, losses)
    model.train()
    with torch.no_grad():
        end = float(model.batch_loss(torch.arange(x.shape[0]), model._input))
    assert losses[-1] == pytest.approx(end, rel=1e-6)
    assert all(0 < rmse < 4 for _, _, rmse, _ in rows), rows


def test_bench_lbfgs_defaults_to_the_models_penalties(capsys):
    """Without --l2 / --l2-kernel the L-BFGS run has KernelNet's default ("auto")
    penalties, as the Adam training it is compared with; given, they are used."""
    import bench_lbfgs
    from nnsparse.data import split_ratings, synthetic_ratings
    train, _ = split_ratings(synthetic_ratings(0, 200, 300, 8_000), 0.2, seed=0)  # --quick's
    grow = (len(train) / 80_000) ** 0.4
    bench_lbfgs.main(["--quick", "--rounds", "1", "--iters", "1"])
    assert f"l2 {20 * grow:.4g}, l2_kernel {0.006 * grow:.4g}" in capsys.readouterr().out
    bench_lbfgs.main(["--quick", "--rounds", "1", "--iters", "1", "--l2", "3"])
    assert f"l2 3, l2_kernel {0.006 * grow:.4g}" in capsys.readouterr().out


def _ml100k_files(tmp_path):
    """u1.base / u1.test and the u.item genres CFN++ reads, ML-100K's formats, written
    from generated ratings (40 users x 25 items)."""
    import numpy as np
    rng = np.random.default_rng(0)
    users, items = 40, 25
    pairs = [(u, i) for u in range(1, users + 1) for i in range(1, items + 1)
             if rng.random() < 0.5]
    lines = [f"{u}\t{i}\t{rng.integers(1, 6)}\t8800000{k:02d}" for k, (u, i) in enumerate(pairs)]
    (tmp_path / "u1.base").write_text("\n".join(x for j, x in enumerate(lines) if j % 5) + "\n")
    (tmp_path / "u1.test").write_text("\n".join(lines[::5]) + "\n")
    (tmp_path / "u.item").write_text("".join(
        f"{i}|Film {i} (1995)|01-Jan-1995||http://x|" + "|".join(
            "1" if g == i % 19 else "0" for g in range(19)) + "\n" for i in range(1, items + 1)))
    return str(tmp_path / "u1.base"), str(tmp_path / "u1.test")


def test_bench_models_runs_on_rating_files(tmp_path):
    """--train/--test: the ladder on real-format files (ML-100K's u1.base/u1.test and the
    u.item genres CFN++ reads), written here from generated ratings."""
    _ml100k_files(tmp_path)
    script = os.path.join(ROOT, "benchmarks", "bench_models.py")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, script, "--quick", "--threads", "1",
                           "--train", str(tmp_path / "u1.base"), "--test", str(tmp_path / "u1.test"),
                           "--format", "ml-100k", "--models", "autorec", "cfn++"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| model")]
    assert rows == ["item mean", "most popular (ranking only)", "biased MF (_baselines.py)",
                    "dense I-AutoRec (_baselines.py)", "nnsparse.models autorec",
                    "nnsparse.models cfn++"], done.stdout
    cells = [[c.strip() for c in line.split("|")[2:-1]] for line in done.stdout.splitlines()
             if line.startswith("| ") and not line.startswith("| model")]
    rmses = [float(c[0]) for c in cells if c[0]]  # most popular ranks only: no RMSE
    assert len(rmses) == 5 and all(0 < r < 5 for r in rmses), done.stdout
    # the ranking columns (precision, recall, NDCG, hit rate @10) after RMSE and seconds:
    # every row but the two _baselines.py ones, which predict only the test pairs
    ranked = [[float(x) for x in c[2:]] for c in cells if c[2]]
    assert len(ranked) == 4 and all(len(r) == 4 and all(0 <= x <= 1 for x in r)
                                    for r in ranked), done.stdout
    assert [c[2:] for c in cells[2:4]] == [[""] * 4] * 2, done.stdout


# bench_models' ranking columns, by hand: 3 users x 5 items (ids 1-5 are indices 0-4).
# Training: user 0 rated items 0 (5 stars) and 1 (3); user 1 items 1 (3) and 2 (4); user 2
# items 1 (3) and 3 (5).  Test: user 0 items 2 (5) and 4 (2); user 1 item 0 (3); user 2
# item 4 (5).  Most popular: training counts 1, 3, 1, 1, 0 -> order 1, 0, 2, 3, 4 (the ties
# 0, 2, 3 to the smaller index).  Item mean: 5, 3, 4, 5 and, for item 4 without training
# ratings, the global mean 23/6 -> order 0, 3 (a tie at 5: the smaller index first), 2, 4,
# 1.  Each user's list is that order less its training items:
#   most popular: user 0 [2, 3, 4], user 1 [0, 3, 4], user 2 [0, 2, 4]
#   item mean:    user 0 [3, 2, 4], user 1 [0, 3, 4], user 2 [0, 2, 4]
_L3 = 1 / math.log2(3)  # the discount of the second place
_RANK_TRAIN = "1 1 5\n1 2 3\n2 2 3\n2 3 4\n3 2 3\n3 4 5\n"
_RANK_TEST = "1 3 5\n1 5 2\n2 1 3\n3 5 5\n"
# (k, threshold, row, {metric: value}); relevant >= 4: user 0's item 2 and user 2's item 4
RANKING_BY_HAND = [
    # user 0: a hit at place 1 of 2 relevant; user 1: a hit at place 1; user 2: none
    (2, None, "most popular (ranking only)",
     {"precision": 1 / 3, "recall": (0.5 + 1) / 3, "ndcg": (1 / (1 + _L3) + 1) / 3,
      "hit_rate": 2 / 3}),
    # user 0's item 2 at place 2 (item 3 ties item 0 at 5 stars and comes before it)
    (2, None, "item mean",
     {"precision": 1 / 3, "recall": (0.5 + 1) / 3, "ndcg": (_L3 / (1 + _L3) + 1) / 3,
      "hit_rate": 2 / 3}),
    # users 0 and 2 evaluated (user 1's 3 stars are below 4)
    (2, 4.0, "most popular (ranking only)",
     {"precision": 0.25, "recall": 0.5, "ndcg": 0.5, "hit_rate": 0.5}),
    (2, 4.0, "item mean", {"precision": 0.25, "recall": 0.5, "ndcg": _L3 / 2, "hit_rate": 0.5}),
    # k above the 3 candidates: shorter lists, precision still / k; user 0 hits at places
    # 1 and 3 (ideal: 2 places), user 1 at 1, user 2 at 3
    (4, None, "most popular (ranking only)",
     {"precision": (2 / 4 + 1 / 4 + 1 / 4) / 3, "recall": 1.0,
      "ndcg": ((1 + 0.5) / (1 + _L3) + 1 + 0.5) / 3, "hit_rate": 1.0}),
]


@pytest.mark.parametrize("k, threshold, row, expected", RANKING_BY_HAND)
def test_bench_models_ranking_columns_of_the_baselines_by_hand(tmp_path, capsys, k, threshold,
                                                               row, expected):
    """The baselines' ranking columns follow evaluate_ranking's protocol: every item a
    candidate less the user's training items, score descending with ties to the smaller
    item index, precision hits / k, recall hits / relevant, NDCG over min(k, relevant)
    ideal places; the columns printed after RMSE and seconds, 4 decimals."""
    import bench_models
    (tmp_path / "r.base").write_text(_RANK_TRAIN)
    (tmp_path / "r.test").write_text(_RANK_TEST)
    argv = ["--train", str(tmp_path / "r.base"), "--test", str(tmp_path / "r.test"),
            "--format", "text", "--threads", "1", "--no-baselines", "--models", "--k", str(k)]
    if threshold is not None:
        argv += ["--rank-threshold", str(threshold)]
    rows = bench_models.main(argv)
    assert list(rows) == ["item mean", "most popular (ranking only)"]
    suffix = "" if threshold is None else f" >={threshold:g}"
    got = rows[row][2]
    for metric, value in expected.items():
        assert got[f"{metric}@{k}{suffix}"] == pytest.approx(value, abs=1e-12), (metric, got)
    assert (rows[row][0] is None) == (row != "item mean")
    out = capsys.readouterr().out.splitlines()
    heads = [h.strip() for h in out[1].split("|")[1:-1]]
    names = [f"precision@{k}", f"recall@{k}", f"NDCG@{k}", f"hit rate@{k}"]
    assert heads == ["model", "test RMSE", "seconds"] + names + (
        [] if threshold is None else [f"{n}, relevant >= 4" for n in names])
    line = next(x for x in out if x.startswith(f"| {row} |"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[-4:] == [f"{expected[m]:.4f}" for m in bench_models._METRICS]  # the last 4


def _autorec_on(tmp_path, test_text: str, *flags: str):
    """bench_models' rows for AutoRec (--quick, k 2) trained on _RANK_TRAIN, tested on
    ``test_text``."""
    import bench_models
    (tmp_path / "r.base").write_text(_RANK_TRAIN)
    (tmp_path / "r.test").write_text(test_text)
    return bench_models.main(["--train", str(tmp_path / "r.base"), "--test",
                              str(tmp_path / "r.test"), "--format", "text", "--threads", "1",
                              "--no-baselines", "--models", "autorec", "--quick", "--k", "2",
                              "--recommend", "-1", *flags])


@pytest.mark.parametrize("test_text, ranked", [(_RANK_TEST + "1 1 4\n", True),
                                               ("1 1 4\n2 3 5\n", False)])
def test_bench_models_ranks_without_the_test_pairs_rated_in_training(tmp_path, capsys,
                                                                     test_text, ranked):
    """A test pair the training file rates too is left out of the ranking with a note (it
    could never be a hit; evaluate_ranking refuses it: this ended in a traceback), the
    RMSE keeps it; no ranking columns when every test pair is one."""
    rows = _autorec_on(tmp_path, test_text)
    out = capsys.readouterr().out
    why = ("(their (user, item) pair is rated in --train too, and the ranking leaves each "
           "user's training items out)")
    # the note of examples/movielens_autoencoder.py's ranked_part, which bench_models calls
    assert ((f"test ranking: 1 of the {test_text.count(chr(10))} test ratings left out {why}"
             if ranked else f"test ranking skipped: all 2 test ratings are left out {why}")
            in out)
    assert all(rows[name][0] is not None for name in ("item mean", "nnsparse.models autorec"))
    if ranked:  # the figures of the test file without the shared pair (worked by hand above)
        for metric, value in RANKING_BY_HAND[0][3].items():
            assert rows["most popular (ranking only)"][2][f"{metric}@2"] == pytest.approx(value)
        assert 0 <= rows["nnsparse.models autorec"][2]["ndcg@2"] <= 1
    else:
        assert all(row[2] == {} for row in rows.values())
        assert "| model | test RMSE | seconds |\n|---|---|---|\n" in out


def test_bench_models_threshold_above_every_test_rating_drops_its_columns(tmp_path, capsys):
    """--rank-threshold above every test rating: a note and the plain ranking columns only
    (evaluate_ranking refuses it: the run ended in a traceback)."""
    rows = _autorec_on(tmp_path, _RANK_TEST, "--rank-threshold", "5.5")
    out = capsys.readouterr().out
    assert ("ranking: no test rating to rank reaches --rank-threshold 5.5 (the highest is 5), "
            "no columns for it") in out
    for metric, value in RANKING_BY_HAND[0][3].items():
        assert rows["most popular (ranking only)"][2][f"{metric}@2"] == pytest.approx(value)
    assert all(">=" not in key for row in rows.values() for key in row[2])


@pytest.mark.parametrize("argv, expected", [
    (["--k", "0"], "--k must be a positive int, got 0"),
    (["--rank-threshold", "nan"], "--rank-threshold must be finite, got nan"),
])
def test_bench_models_ranking_arguments_are_checked(capsys, argv, expected):
    import bench_models
    with pytest.raises(SystemExit) as raised:
        bench_models.main(argv + ["--models"])
    assert raised.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(": error: " + expected)


@pytest.mark.parametrize("script", ["bench_models", "bench_lbfgs"])
def test_bench_format_auto_is_the_default_and_reads_as_the_explicit_format(tmp_path, script):
    """--format defaults to auto: on ML-100K files (u1.base/u1.test, and u.item for CFN++'s
    genres, which bench_models reads in the detected format) the rows are those of
    --format ml-100k."""
    import bench_lbfgs
    import bench_models
    train, test = _ml100k_files(tmp_path)
    if script == "bench_models":
        common = ["--quick", "--threads", "1", "--no-baselines", "--models", "cfn++",
                  "--train", train, "--test", test]
        runs = [{k: v[0] for k, v in bench_models.main(common + extra).items()}
                for extra in ([], ["--format", "auto"], ["--format", "ml-100k"])]
    else:
        common = ["--quick", "--rounds", "1", "--iters", "1", "--train", train, "--test", test]
        runs = [[row[:3] for row in bench_lbfgs.main(common + extra)]
                for extra in ([], ["--format", "auto"], ["--format", "ml-100k"])]
    assert runs[0] == runs[1] == runs[2]
    assert runs[0]


# (id, the training file's text or None: no file, the error after argparse's "error: ")
UNDETECTABLE = [
    # (3 comma-separated fields, '1,10,4', were one: format 'csv' reads them now)
    ("five-commas", "1,10,4,0,x\n",
     "--train: cannot detect the format of {train}: its first line '1,10,4,0,x' has 5 "
     "comma-separated fields, and format 'csv' reads 3 or 4, user,item,rating[,timestamp] "
     "(MovieLens ratings.csv: userId,movieId,rating,timestamp); no format reads 5 "
     "comma-separated fields: save the file whitespace-separated, 'user item rating "
     "[timestamp]', and give format 'text'\n"),
    ("empty", "", "--train: {train} holds no ratings (empty file)\n"),
    ("missing", None, "--train: no rating file at {train} (it does not exist)\n"),
]


@pytest.mark.parametrize("content, expected", [c[1:] for c in UNDETECTABLE],
                         ids=[c[0] for c in UNDETECTABLE])
def test_bench_models_format_auto_undetectable_is_an_argparse_error(tmp_path, capsys, content,
                                                                     expected):
    """A training file whose format cannot be detected: an argparse error naming --train and
    the reason, before anything is read or trained; no advice to give --format, which reads
    none of these files either (the error said "give --format, one of ml-100k, ...")."""
    import bench_models
    train, test = tmp_path / "r.base", tmp_path / "r.test"
    if content is not None:
        train.write_text(content)
    test.write_text("1 10 4\n")
    with pytest.raises(SystemExit) as raised:
        bench_models.main(["--train", str(train), "--test", str(test), "--models", "autorec"])
    assert raised.value.code == 2
    assert capsys.readouterr().err.endswith(
        ": error: " + expected.format(train=train))


def test_ml100k_from_recbole_rebuilds_the_canonical_folds(tmp_path):
    """The u1..u5 rule of MovieLens's mku.sh on a small wheel of the same layout (40,000
    generated ratings: two folds), and the u.item genre flags the readers take."""
    import zipfile
    import numpy as np
    import ml100k_from_recbole as conv
    from nnsparse.data import read_item_features, read_split
    rng = np.random.default_rng(0)
    keys = rng.choice(400 * 300, size=40_000, replace=False)
    inter = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"] + [
        f"{k // 300 + 1}\t{k % 300 + 1}\t{rng.integers(1, 6)}\t{880000000 + j}"
        for j, k in enumerate(keys)]
    items = ["item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq"] + [
        f"{i}\tFilm {i}\t1995\t{'Action Sci-Fi' if i % 2 else 'Drama'}" for i in range(1, 301)]
    users = ["user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token"] + [
        f"{u}\t{20 + u % 40}\t{'MF'[u % 2]}\tother\t0{u:04d}" for u in range(1, 401)]
    wheel = tmp_path / "recbole-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for kind, lines in (("inter", inter), ("item", items), ("user", users)):
            z.writestr(conv._PREFIX + kind, "\n".join(lines) + "\n")
    out = tmp_path / "ml-100k"
    assert conv.convert(str(wheel), str(out)) == 40_000
    data = (out / "u.data").read_text().splitlines()
    assert data == inter[1:]
    test1 = (out / "u1.test").read_text().splitlines()
    assert test1 == sorted(data[:20_000], key=conv._key)
    assert sorted((out / "u2.base").read_text().splitlines(), key=conv._key) == test1
    assert not (out / "u3.test").exists()
    train, test = read_split(out / "u1.base", out / "u1.test", "ml-100k")
    assert len(train) == len(test) == 20_000
    genres = read_item_features(out / "u.item", "ml-100k", train.item_map)
    first = train.item_map[1]  # item 1: Action and Sci-Fi
    assert genres[first].nonzero().flatten().tolist() == [
        conv.GENRES.index("Action"), conv.GENRES.index("Sci-Fi")]


def test_step_cost_benchmarks_run():
    """bench_step_checks and bench_grad_checks (their model and options in _step_model.py)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    small = ["--rows", "64", "--width", "300", "--per-row", "20", "--batch", "16",
             "--hidden", "16", "--repeat", "2", "--warmup", "1", "--threads", "1"]
    for name, shown in (("bench_step_checks.py", "the check alone"),
                        ("bench_grad_checks.py", "sparse gradients")):
        done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", name), *small],
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "threads=1" in done.stdout and shown in done.stdout, done.stdout


def test_bench_models_takes_home_relative_files(tmp_path, monkeypatch, capsys):
    """--train=~/... (a shell leaves it as it is): the readers take '~' as the home
    directory, and so does the u.item lookup of CFN++'s genres (it said 'cfn++ needs the
    item genres of --format ml-100k next to ~/ml-100k/u1.base; none found')."""
    import bench_models
    (tmp_path / "ml-100k").mkdir()
    _ml100k_files(tmp_path / "ml-100k")
    monkeypatch.setenv("HOME", str(tmp_path))
    rows = bench_models.main(["--train=~/ml-100k/u1.base", "--test=~/ml-100k/u1.test",
                              "--threads", "1", "--no-baselines", "--models", "cfn++",
                              "--quick", "--recommend", "-1"])
    assert "~/ml-100k/u1.base -> ~/ml-100k/u1.test" in capsys.readouterr().out
    assert 0 < rows["nnsparse.models cfn++"][0] < 5
