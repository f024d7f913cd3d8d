"""Smoke tests of the examples: each runs on its built-in data with tiny settings."""
import json
import math

import pytest
import torch

from example_script import load_example as _load


TINY = ["--epochs", "2", "--hidden", "24", "--batch-size", "64", "--no-progress"]


def test_movielens_autoencoder_default_run(tmp_path, capsys):
    main = _load("movielens_autoencoder").main
    metrics, model = tmp_path / "metrics.json", tmp_path / "model.pt"
    result = main(TINY + ["--metrics-out", str(metrics), "--save", str(model)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"test RMSE: {result['test_rmse']:.4f}"
    assert lines[-2].startswith("test MAE: ") and "item-mean baseline" in lines[-4]
    rank = result["ranking"]
    assert lines[-3] == (
        f"test ranking ({rank['users']} users, all items less their training ones): "
        f"precision@10 {rank['precision@10']:.4f}, recall@10 {rank['recall@10']:.4f}, "
        f"NDCG@10 {rank['ndcg@10']:.4f}, hit rate@10 {rank['hit_rate@10']:.4f} "
        f"({rank['seconds']:.1f} s)")
    saved = json.loads(metrics.read_text())
    assert saved["ranking"] == {**rank, "threshold": None}
    assert rank["k"] == 10 and rank["users"] > 900 and 0 < rank["ndcg@10"] < 1
    assert [e["epoch"] for e in saved["epochs"]] == [1, 2]
    assert all(math.isfinite(e["valid_rmse"]) for e in saved["epochs"])
    assert 0.5 < result["test_rmse"] < 2.0 and 0.5 < result["item_mean_rmse"] < 2.0
    again = main(TINY + ["--load", str(model)])
    assert again["test_rmse"] == pytest.approx(result["test_rmse"], abs=1e-6)
    # the loaded model ranks the same test part as the one saved (its training items too)
    assert {**again["ranking"], "seconds": 0} == {**rank, "seconds": 0}


def test_dense_decoder_gives_the_same_rmse():
    main = _load("movielens_autoencoder").main
    sparse = main(TINY)
    dense = main(TINY + ["--dense-decoder"])
    assert dense["test_rmse"] == pytest.approx(sparse["test_rmse"], abs=1e-4)


def test_movielens_autoencoder_on_files_and_recommend(tmp_path, capsys):
    main = _load("movielens_autoencoder").main
    from nnsparse.data import synthetic_ratings
    r = synthetic_ratings(seed=1, n_users=60, n_items=80, n_ratings=2000)
    lines = [f"{u + 1}\t{i + 1}\t{int(x)}\t0" for u, i, x in
             zip(r.user.tolist(), r.item.tolist(), r.rating.tolist())]
    (tmp_path / "u.data").write_text("\n".join(lines) + "\n")
    (tmp_path / "u.item").write_text("".join(f"{i}|Film {i}|01-Jan-1995||\n"
                                             for i in range(1, 81)), encoding="latin-1")
    for orientation in ("item", "user"):
        main(TINY + ["--ratings", str(tmp_path / "u.data"), "--format", "ml-100k",
                     "--orientation", orientation, "--recommend", "3", "-k", "4"])
        out = capsys.readouterr().out
        assert "top 4 items for user 3:" in out and "Film " in out
        assert "precision@4 " in out and "NDCG@4 " in out  # -k is the ranking's k too
    (tmp_path / "u1.base").write_text("\n".join(lines[:1800]) + "\n")
    (tmp_path / "u1.test").write_text("\n".join(lines[1800:]) + "\n")
    result = main(TINY + ["--train", str(tmp_path / "u1.base"), "--test",
                          str(tmp_path / "u1.test"), "--format", "ml-100k"])
    assert math.isfinite(result["test_rmse"])


@pytest.mark.parametrize("where, model", [("directory", "cfn++"), ("file", "autorec"),
                                          ("--ratings=~/ml-1m/", "cfn++")])
def test_movielens_autoencoder_on_an_unzipped_ml1m_without_format(tmp_path, capsys, monkeypatch,
                                                                  where, model):
    """``--ratings ml-1m`` or ``--ratings ml-1m/ratings.dat`` as a user unzips it, no --format:
    the format is detected (and cfn++ finds the genres in movies.dat, in latin-1).  A ``~``
    no shell expanded (``--ratings=~/ml-1m/``) is the home directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    main = _load("movielens_autoencoder").main
    from nnsparse.data import synthetic_ratings
    r = synthetic_ratings(seed=2, n_users=50, n_items=60, n_ratings=1500)
    folder = tmp_path / "ml-1m"
    folder.mkdir()
    (folder / "ratings.dat").write_text("".join(
        f"{u + 1}::{i + 1}::{int(x)}::978300760\n"
        for u, i, x in zip(r.user.tolist(), r.item.tolist(), r.rating.tolist())))
    (folder / "movies.dat").write_bytes("".join(
        f"{i}::Café {i} (1995)::{'Drama' if i % 2 else 'Comedy|Drama'}\n"
        for i in range(1, 61)).encode("latin-1"))
    path = {"directory": ["--ratings", str(folder)], "file": [
        "--ratings", str(folder / "ratings.dat")]}.get(where, [where])
    result = main(path + ["--model", model, "--epochs", "1", "--hidden", "8", "--no-progress"])
    out = capsys.readouterr().out
    assert out.startswith("1500 ratings, 50 users x 60 items")
    assert out.strip().splitlines()[-1] == f"test RMSE: {result['test_rmse']:.4f}"
    assert math.isfinite(result["test_rmse"]) and result["args"]["format"] == "ml-1m"


def _u_data(tmp_path, seed, first_user=1):
    """A 40-user, 50-item, 1,000-rating ``u.data`` (ML-100K format) from
    ``synthetic_ratings(seed)``, its user ids from ``first_user``: the file's path."""
    from nnsparse.data import synthetic_ratings
    r = synthetic_ratings(seed=seed, n_users=40, n_items=50, n_ratings=1000)
    data = tmp_path / "u.data"
    data.write_text("".join(f"{u + first_user}\t{i + 1}\t{int(x)}\t0\n"
                            for u, i, x in zip(r.user.tolist(), r.item.tolist(),
                                               r.rating.tolist())))
    return data


def test_a_loaded_model_on_other_ratings_is_a_usage_error(tmp_path, capsys):
    """``--load m.pt`` without the ``--ratings`` it was trained on: the default set's ids are
    not the model's, and the example says so as a usage error, not a traceback."""
    main = _load("movielens_autoencoder").main
    data = _u_data(tmp_path, seed=4, first_user=7)
    model = tmp_path / "m.pt"
    main(TINY + ["--ratings", str(data), "--model", "autorec", "--save", str(model)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(TINY + ["--load", str(model)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "cannot evaluate the model on these ratings: ratings must index users" in err
    assert f"(--load {model}: give the --ratings it was trained on)" in err


def test_an_evaluation_error_of_a_model_trained_here_is_no_usage_error(monkeypatch):
    """Without ``--load`` the model was trained on these ratings' maps: a ``ValueError`` of
    ``evaluate`` is a bug to show (its traceback), not turned into a usage error."""
    main = _load("movielens_autoencoder").main
    from nnsparse.models import RatingModel

    fit = RatingModel.fit

    def fit_then_break(self, *args, **kwargs):  # (fit's validation evaluates too)
        fit(self, *args, **kwargs)

        def broken(ratings):
            raise ValueError("a bug in evaluate")
        self.evaluate = broken
        return self

    monkeypatch.setattr(RatingModel, "fit", fit_then_break)
    with pytest.raises(ValueError, match="^a bug in evaluate$"):
        main(TINY + ["--epochs", "1"])


def test_movielens_autoencoder_folds_directory_without_format(tmp_path, capsys):
    """``--folds ml-100k/`` (u1..uN pairs) as before, now with no --format: detected."""
    main = _load("movielens_autoencoder").main
    from nnsparse.data import synthetic_ratings
    r = synthetic_ratings(seed=3, n_users=40, n_items=50, n_ratings=1000)
    lines = [f"{u + 1}\t{i + 1}\t{int(x)}\t0\n"
             for u, i, x in zip(r.user.tolist(), r.item.tolist(), r.rating.tolist())]
    (tmp_path / "u.data").write_text("".join(lines))
    for k in (1, 2):
        test = set(range(k - 1, len(lines), 2))
        (tmp_path / f"u{k}.base").write_text("".join(l for j, l in enumerate(lines) if j not in test))
        (tmp_path / f"u{k}.test").write_text("".join(lines[j] for j in sorted(test)))
    result = main(TINY + ["--model", "autorec", "--folds", str(tmp_path),
                          "--validation-ratio", "0"])
    assert len(result["folds"]) == 2 and result["args"]["format"] == "ml-100k"
    assert "| mean ± std |" in capsys.readouterr().out


def test_sparse_autoencoder_example(capsys):
    result = _load("sparse_autoencoder").main(
        ["--docs", "300", "--vocab", "400", "--epochs", "2", "--hidden", "16", "8",
         "--no-progress"])
    assert math.isfinite(result["rmse"]) and math.isfinite(result["baseline"])
    assert "autoencoder RMSE on hidden words" in capsys.readouterr().out


def test_composition_example(capsys):
    accuracy = _load("composition").main(["--rows", "128", "--width", "300", "--steps", "30",
                                          "--no-progress"])
    assert set(accuracy) == {"sparse-first", "switching"}
    assert "loads into nn.Linear" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--ratings", "no/such/file.dat"], "--ratings: no file at no/such/file.dat"),
    # a directory is read through its one MovieLens rating file (here u.data), in its format
    (["--ratings", "{tmp}", "--format", "ml-1m"],
     "path: {tmp} holds u.data, a file of format 'ml-100k', but format is 'ml-1m'"),
    (["--train", "{tmp}", "--test", "{tmp}/u.data"], "--train: {tmp} is a directory, not a file"),
    (["--train", "{tmp}/u.data"], "--train and --test go together"),
    (["--batch-size", "0"], "--batch-size must be positive, got 0"),
    (["--hidden", "-1"], "--hidden must be positive, got -1"),
    (["--hidden", "0"], "--hidden must be positive, got 0"),
    (["--epochs", "0"], "--epochs must be positive, got 0"),
    (["--threads", "0"], "--threads must be positive, got 0"),
    (["--hidden", "ten"], "--hidden must be an integer, got 'ten'"),
    (["--folds", "1"], "--folds must be at least 2 folds or a directory, got 1"),
    (["--folds", "5", "--recommend", "3"], "--folds trains one model per fold"),
    (["--test-ratio", "1.5"], "--test-ratio must be in [0, 1), got 1.5"),
    (["--model", "svd"], "invalid choice: 'svd'"),
    (["--recommend", "99999"], "--recommend: user '99999' is not in the training data"),
    # the second bad-input probe: outputs are checked before training, numbers must be finite
    (["--save", "{tmp}"], "--save: {tmp} is a directory, not a file"),
    (["--save", "{tmp}/no/dir/m.pt"], "--save: no directory {tmp}/no/dir to write m.pt in"),
    (["--metrics-out", "{tmp}/no/m.json"], "--metrics-out: no directory {tmp}/no to write m.json in"),
    (["--lr", "inf"], "--lr must be finite, got inf"),
    (["--lr", "nan"], "--lr must be positive, got nan"),
    (["--l2", "nan"], "--l2 must be non-negative and finite, got nan"),
    (["--l2-kernel", "-1"], "--l2-kernel must be non-negative and finite, got -1.0"),
    (["--model", "autorec", "--l2-kernel", "0.01"],
     "--l2-kernel is the kernels' penalty of --model sparsefc or glocalk, got --model autorec"),
    (["--shrinkage", "inf"], "--min-support and --shrinkage must be non-negative (and finite)"),
    (["--seed", "-1"], "--seed must be non-negative, got -1"),
    (["--device", "meta"], "--device must be cpu or cuda[:N], got 'meta'"),
    (["--rank-threshold", "nan"], "--rank-threshold must be finite, got nan"),
    (["--rank-threshold", "5.5"], "--rank-threshold 5.5: no test rating reaches it (the "
                                  "highest is 5), so no user has a relevant item"),
    # every fold is ranked: a threshold above a fold's test ratings, refused before training
    (["--folds", "2", "--rank-threshold", "5.5"], "--rank-threshold 5.5: no test rating of "
     "fold 1 reaches it (the highest is 5), so no user has a relevant item"),
    (["--test-ratio", "0", "--save", "{tmp}/m.pt", "--rank-threshold", "4"],
     "--rank-threshold: --test-ratio 0 leaves no test ratings to rank"),
])
def test_movielens_autoencoder_bad_flags_fail_before_training(tmp_path, capsys, flags, message):
    main = _load("movielens_autoencoder").main
    (tmp_path / "u.data").write_text("1\t1\t5\t0\n")
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    with pytest.raises(SystemExit) as exit:
        main(["--no-progress"] + flags)
    assert exit.value.code == 2
    captured = capsys.readouterr()
    assert message.replace("{tmp}", str(tmp_path)) in captured.err
    assert "epoch 1" not in captured.out  # nothing was trained


@pytest.mark.parametrize("orientation, files, message", [
    ("user", {"ratings.dat": "".join(f"{u}::{i}::{1 + (u + i) % 5}::0\n" for u in range(1, 6)
                                     for i in range(1, 5)),
              "movies.dat": "1::A (1995)::Drama\n"},
     "--model cfn++ needs the user file of --format ml-1m (users.dat) next to the ratings in "
     "{tmp}; only MovieLens-100K (u.user) and -1M (users.dat) ship user demographics, the "
     "later releases none: use --orientation item (genres)"),
    ("item", {"ratings.csv": "userId,movieId,rating,timestamp\n" + "".join(
        f"{u},{i},{1 + (u + i) % 5},0\n" for u in range(1, 6) for i in range(1, 5))},
     "--model cfn++ needs the item file of --format csv (movies.csv) next to the ratings in "
     "{tmp}\n"),
])
def test_cfn_plus_plus_without_its_side_file_is_a_usage_error(tmp_path, capsys, orientation,
                                                             files, message):
    """An ML-10M folder (ratings.dat and movies.dat, no users.dat) with --orientation user:
    the error says that release has no user file and what to use instead."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(SystemExit) as exit:
        _load("movielens_autoencoder").main(["--no-progress", "--ratings", str(tmp_path),
                                             "--model", "cfn++", "--orientation", orientation])
    assert exit.value.code == 2
    assert message.replace("{tmp}", str(tmp_path)) in capsys.readouterr().err


def test_movielens_autoencoder_ranking_threshold(tmp_path, capsys):
    """--rank-threshold: only the test ratings at or above it are relevant (fewer users)."""
    main = _load("movielens_autoencoder").main
    every = main(TINY + ["--epochs", "1"])["ranking"]
    liked = main(TINY + ["--epochs", "1", "--rank-threshold", "4", "-k", "5"])["ranking"]
    out = capsys.readouterr().out
    assert "relevant: rated >= 4): precision@5 " in out
    assert liked["threshold"] == 4.0 and liked["k"] == 5 and "ndcg@5" in liked
    assert 0 < liked["users"] < every["users"]


def test_a_loaded_model_ranked_on_its_training_ratings_is_a_usage_error(tmp_path, capsys):
    """``--load`` with another ``--seed``: the test part holds ratings the model trained on,
    which the ranking (training items left out) refuses, as a usage error."""
    main = _load("movielens_autoencoder").main
    model = tmp_path / "m.pt"
    main(TINY + ["--epochs", "1", "--save", str(model)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(TINY + ["--load", str(model), "--seed", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "cannot rank the test ratings with this model: test together with the model's" in err
    assert f"(--load {model}: give the --ratings and --seed it was trained with)" in err


def test_movielens_autoencoder_says_when_training_diverged(capsys):
    """A learning rate that blows the weights up: one error line, exit status 1."""
    main = _load("movielens_autoencoder").main
    with pytest.raises(SystemExit) as exit:
        main(TINY + ["--model", "autorec", "--lr", "1e30", "--validation-ratio", "0"])
    assert exit.value.code == 1
    err = capsys.readouterr().err
    assert "error: training diverged: the mean training loss of epoch 1 is" in err
    assert "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_movielens_autoencoder_cuda_without_gpu(capsys):
    with pytest.raises(SystemExit):
        _load("movielens_autoencoder").main(["--device", "cuda"])
    assert "--device cuda: no CUDA device is available" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["autorec", "cfn++"])
def test_movielens_autoencoder_folds_table(tmp_path, capsys, model):
    """--folds ranks every fold at -k (10 by default, as the single split): the table's last
    columns, then the mean ± std line before the MAE and RMSE lines."""
    main = _load("movielens_autoencoder").main
    metrics = tmp_path / "metrics.json"
    result = main(TINY + ["--model", model, "--folds", "3", "--validation-ratio", "0",
                          "--metrics-out", str(metrics)])
    out = capsys.readouterr().out
    assert out.count("\n| 1 |") == 1 and "\n| 3 |" in out and "| mean ± std |" in out
    assert len(result["folds"]) == 3 and math.isfinite(result["test_rmse_std"])
    assert result["test_rmse"] == pytest.approx(sum(f["rmse"] for f in result["folds"]) / 3)
    assert ("| seconds | precision@10 | recall@10 | NDCG@10 | hit rate@10 |\n"
            + "|---" * 11 + "|\n") in out
    lines = out.strip().splitlines()
    rank, folds = result["ranking"], result["folds"]
    assert rank["k"] == 10 and rank["threshold"] is None and rank["folds"] == 3
    assert rank["users"] == [f["ranked_users"] for f in folds]
    for key in ("precision@10", "recall@10", "ndcg@10", "hit_rate@10"):
        values = [f[key] for f in folds]
        assert rank[key] == pytest.approx(sum(values) / 3)
        assert rank[f"{key}_std"] == pytest.approx(
            math.sqrt(sum((v - rank[key]) ** 2 for v in values) / 2))
    assert lines[-3] == (
        f"test ranking (mean ± std of 3 folds, {min(rank['users'])}-{max(rank['users'])} "
        f"users a fold, all items less their training ones): "
        f"precision@10 {rank['precision@10']:.4f} ± {rank['precision@10_std']:.4f}, "
        f"recall@10 {rank['recall@10']:.4f} ± {rank['recall@10_std']:.4f}, "
        f"NDCG@10 {rank['ndcg@10']:.4f} ± {rank['ndcg@10_std']:.4f}, "
        f"hit rate@10 {rank['hit_rate@10']:.4f} ± {rank['hit_rate@10_std']:.4f} "
        f"({rank['seconds']:.1f} s in all)")
    assert lines[-2] == f"test MAE: {result['test_mae']:.4f}"
    assert lines[-1] == f"test RMSE: {result['test_rmse']:.4f}"
    saved = json.loads(metrics.read_text())
    assert saved["ranking"] == rank and saved["folds"][0]["ndcg@10"] == folds[0]["ndcg@10"]


def test_movielens_autoencoder_folds_rank_threshold_and_k(capsys):
    """--folds with --rank-threshold and -k: no more relevant users a fold, lists of -k."""
    main = _load("movielens_autoencoder").main
    every = main(TINY + ["--epochs", "1", "--model", "autorec", "--folds", "2"])["ranking"]
    liked = main(TINY + ["--epochs", "1", "--model", "autorec", "--folds", "2",
                         "--rank-threshold", "4", "-k", "5"])
    out = capsys.readouterr().out
    rank = liked["ranking"]
    assert rank["k"] == 5 and rank["threshold"] == 4.0 and "ndcg@5" in liked["folds"][1]
    assert "users a fold, all items less their training ones, relevant: rated >= 4): " \
           "precision@5 " in out and "| NDCG@5 | hit rate@5 |" in out
    assert all(a <= b for a, b in zip(rank["users"], every["users"]))


def test_movielens_autoencoder_l2_kernel_reaches_sparse_fc():
    example = _load("movielens_autoencoder")
    parser = example.build_parser()
    args = parser.parse_args(["--l2", "70", "--l2-kernel", "0.018"])
    assert example.hparams(args)["l2"] == 70.0 and example.hparams(args)["l2_kernel"] == 0.018
    assert "l2_kernel" not in example.hparams(parser.parse_args([]))  # the model's default
    assert example.KernelNet(**{k: v for k, v in example.hparams(args).items()}).hparams[
        "l2_kernel"] == 0.018


def test_glocalk_in_the_example_folds_save_and_load(tmp_path, capsys):
    """``--model glocalk``: cross-validated with ranking, then saved and loaded again."""
    main = _load("movielens_autoencoder").main
    data = _u_data(tmp_path, seed=2)
    small = ["--ratings", str(data), "--model", "glocalk", "--epochs", "2", "--hidden", "8",
             "--batch-size", "16", "--no-progress"]
    folds = main(small + ["--folds", "2", "-k", "5"])
    assert len(folds["folds"]) == 2 and math.isfinite(folds["test_rmse"])
    assert 0 <= folds["ranking"]["ndcg@5"] <= 1
    model = tmp_path / "g.pt"
    saved = main(small + ["--save", str(model)])
    torch.load(model, weights_only=True)
    loaded = main(["--ratings", str(data), "--no-progress", "--load", str(model)])
    assert loaded["test_rmse"] == pytest.approx(saved["test_rmse"], abs=1e-6)
    assert "GLocal-K stage 2" in capsys.readouterr().out


SMALL_IMPLICIT = ["--synthetic-users", "300", "--synthetic-items", "400", "--synthetic-ratings",
                  "15000", "--batch-size", "50", "--test-users", "40", "--validation-users",
                  "30", "--threads", "1", "--no-progress"]


def test_implicit_mult_dae_beats_popularity(capsys):
    """The Mult-DAE example on a small synthetic set: every test figure above the
    item-popularity baseline's, ranked the same way; the table's rows as returned."""
    result = _load("implicit_mult_dae").main(SMALL_IMPLICIT + ["--epochs", "60"])
    out = capsys.readouterr().out
    dae, popularity = result["results"]["Mult-DAE"], result["results"]["popularity"]
    for key in ("Recall@20", "Recall@50", "NDCG@100"):
        assert 0 <= popularity[key] < dae[key] <= 1, key
    assert dae["NDCG@100"] > popularity["NDCG@100"] + 0.05
    assert result["users"] == 40 and 1 <= result["best_epoch"] <= 60
    assert "| model | Recall@20 | Recall@50 | NDCG@100 |" in out
    assert out.rstrip().endswith(f"| Mult-DAE | {dae['Recall@20']:.4f} | "
                                 f"{dae['Recall@50']:.4f} | {dae['NDCG@100']:.4f} |")
    assert "(the others dropped, as the paper)" in out


def test_implicit_mult_dae_reads_a_rating_file(tmp_path, capsys):
    """--ratings (an ML-1M ratings.dat, format detected), --threshold and --min-clicks:
    the clicks are the ratings at or above the threshold of the users with enough."""
    from nnsparse.data import synthetic_ratings
    r = synthetic_ratings(seed=1, n_users=150, n_items=120, n_ratings=6000, titles=False)
    (tmp_path / "ratings.dat").write_text("".join(
        f"{u + 1}::{i + 1}::{int(x)}::0\n" for u, i, x in
        zip(r.user.tolist(), r.item.tolist(), r.rating.tolist())))
    result = _load("implicit_mult_dae").main(
        ["--ratings", str(tmp_path / "ratings.dat"), "--threshold", "3", "--min-clicks", "10",
         "--epochs", "2", "--batch-size", "32", "--test-users", "20",
         "--validation-users", "10", "--no-progress"])
    kept = r.rating >= 3
    per_user = torch.bincount(r.user[kept], minlength=r.n_users)
    assert result["clicks"] == int((per_user[r.user[kept]] >= 10).sum())
    assert f"{result['clicks']} clicks (ratings >= 3) of {int((per_user >= 10).sum())} users" \
        in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--ratings", "no/such/file.dat"], "--ratings: no file or directory at no/such/file.dat"),
    (["--dropout", "1"], "--dropout must be in [0, 1), got 1.0"),
    (["--fold-in", "1"], "--fold-in must be in (0, 1), got 1.0"),
    (["--threshold", "nan"], "--threshold must be finite, got nan"),
    (["--lam", "-1"], "--lam must be non-negative and finite, got -1.0"),
    (["--hidden", "0"], "--hidden must be positive and finite, got 0"),
    (["--test-users", "many"], "--test-users must be a number of users or a fraction of them"),
    (["--threshold", "6"], "no user has 5 ratings >= --threshold 6 in synthetic_ratings(seed=0)"),
    (["--test-users", "0.6", "--validation-users", "0.5"],
     "cannot split the users: test + validation must be below 1, got 0.6 + 0.5"),
])
def test_implicit_mult_dae_bad_flags_fail_before_training(capsys, flags, message):
    with pytest.raises(SystemExit) as exit:
        _load("implicit_mult_dae").main(["--no-progress"] + flags)
    assert exit.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and "epoch" not in captured.out
