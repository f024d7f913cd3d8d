"""Train a collaborative-filtering autoencoder and report its test RMSE.

The model of Strub, Gaudel & Mary (CFN): an item's (or user's) sparse vector
of ratings goes through ``SparseLinearBatch -> tanh -> linear -> tanh`` and
comes back with the missing ratings predicted.  It is trained with
``SDAESparseCriterion(MSELoss)``: a share of the known ratings is hidden from
the input and the loss weighs them by ``alpha``, the others by ``beta``.  The
decoder is a ``SparseOutputLinear`` evaluated at the known ratings only
(``--dense-decoder`` computes every output instead; same numbers).

    python examples/movielens_autoencoder.py                       # synthetic default
    python examples/movielens_autoencoder.py --ratings ml-1m/ratings.dat --format ml-1m
    python examples/movielens_autoencoder.py --train u1.base --test u1.test --format ml-100k
    python examples/movielens_autoencoder.py --recommend 42 -k 10

Ratings are split at random (90% train, 10% test; 5% of train kept for
validation) unless ``--train/--test`` are given.  Each epoch prints the train
loss and the validation RMSE on the rating scale; the test part is read once,
at the end, beside the item-mean baseline.  The last line is
``test RMSE: <value>``.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

import nnsparse
from nnsparse.data import (FORMATS, RatingErrors, RatingNormalizer, SparseRowDataset,
                           holdout_split, mae, mean_prediction, random_split, read_ratings,
                           read_split, rmse, synthetic_ratings)


class Autoencoder(nn.Module):
    """``tanh(decoder(tanh(encoder(x))))``, the decoder sampled at ``pattern`` when given."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(width, hidden)
        self.decoder = nnsparse.SparseOutputLinear(hidden, width)

    def forward(self, x: Any, pattern: Any = None) -> Any:
        out = self.decoder(torch.tanh(self.encoder(x)), pattern)
        return nnsparse.values_map(torch.tanh, out)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = p.add_argument_group("data")
    data.add_argument("--ratings", help="a rating file (default: the synthetic set)")
    data.add_argument("--format", choices=FORMATS, default="text", help="the files' format")
    data.add_argument("--train", help="a given training file (with --test)")
    data.add_argument("--test", help="a given test file (with --train)")
    data.add_argument("--orientation", choices=["item", "user"], default="item",
                      help="item: rows are items (I-autoencoder); user: rows are users")
    data.add_argument("--test-ratio", type=float, default=0.1)
    data.add_argument("--validation-ratio", type=float, default=0.05)
    model = p.add_argument_group("model and training")
    model.add_argument("--hidden", type=int, default=500)
    model.add_argument("--epochs", type=int, default=40)
    model.add_argument("--batch-size", type=int, default=32)
    model.add_argument("--lr", type=float, default=3e-4, help="Adam's learning rate")
    model.add_argument("--weight-decay", type=float, default=1e-3,
                       help="L2 penalty added to every gradient (Adam's weight_decay)")
    model.add_argument("--alpha", type=float, default=1.0, help="weight of hidden ratings")
    model.add_argument("--beta", type=float, default=0.5, help="weight of the other ratings")
    model.add_argument("--hide-ratio", type=float, default=0.25,
                       help="share of input ratings hidden (denoising)")
    model.add_argument("--dense-decoder", action="store_true",
                       help="compute every output in training (the slow way)")
    model.add_argument("--seed", type=int, default=0)
    model.add_argument("--device", default="cpu", help="cpu or cuda")
    out = p.add_argument_group("output")
    out.add_argument("--metrics-out", help="write every epoch's numbers to this JSON file")
    out.add_argument("--save", help="save the trained model to this file")
    out.add_argument("--load", help="load a model saved with --save instead of training")
    out.add_argument("--recommend", help="print this user's top-k unrated items (original id)")
    out.add_argument("-k", type=int, default=10, help="how many items --recommend prints")
    out.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    args = p.parse_args(argv)
    if (args.train is None) != (args.test is None):
        p.error("--train and --test go together")
    if args.ratings and args.train:
        p.error("give either --ratings or --train/--test")
    return args


def load_split(args: argparse.Namespace):
    """Training, validation and test ratings, and the set the titles come from."""
    if args.train:
        train, test = read_split(args.train, args.test, args.format)
        return holdout_split(train, test, validation=args.validation_ratio, seed=args.seed), train
    ratings = (read_ratings(args.ratings, args.format) if args.ratings
               else synthetic_ratings(seed=args.seed))
    split = random_split(ratings, test=args.test_ratio, validation=args.validation_ratio,
                         seed=args.seed)
    return split, ratings


def evaluate(model: Autoencoder, norm: RatingNormalizer, inputs: torch.Tensor,
             target: torch.Tensor, device: torch.device) -> Dict[str, float]:
    """RMSE and MAE on the rating scale at ``target``'s entries, rows of ``inputs`` as input."""
    data = SparseRowDataset(inputs, target)
    errors = RatingErrors()
    model.eval()
    with torch.no_grad():
        for rows, x, y in DataLoader(data, batch_size=256, collate_fn=data.collate):
            x, y = x.to(device), y.to(device)
            # the decoder evaluated at the target's entries only
            est = model(x, y).to_sparse_coo().coalesce()
            batch = y.to_sparse_coo().coalesce()
            pred = norm.denormalize(est.values(), rows.to(device)[batch.indices()[0]])
            errors.update(pred, batch.values())
    return errors.compute()


def train(args: argparse.Namespace, model: Autoencoder, norm: RatingNormalizer,
          x_train: torch.Tensor, x_valid: torch.Tensor, device: torch.device) -> List[dict]:
    data = SparseRowDataset(x_train)
    generator = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True,
                        collate_fn=data.collate, generator=generator)
    criterion = nnsparse.SDAESparseCriterion(
        nn.MSELoss(), alpha=args.alpha, beta=args.beta, hide_ratio=args.hide_ratio,
        generator=torch.Generator(device=device).manual_seed(args.seed))
    optimiser = torch.optim.Adam(model.parameters(), lr=args.lr,
                                 weight_decay=args.weight_decay)
    history: List[dict] = []
    best = (math.inf, None)
    for epoch in range(1, args.epochs + 1):
        model.train()
        start, loss_sum = time.perf_counter(), 0.0
        bar = tqdm(loader, desc=f"epoch {epoch}/{args.epochs}", disable=args.no_progress,
                   leave=False)
        for _, x, _ in bar:
            x = x.to(device)
            out = model(criterion.prepare_input(x), None if args.dense_decoder else x)
            loss = criterion(out, x)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            loss_sum += loss.item()
            bar.set_postfix(loss=f"{loss.item():.4f}")
        valid = evaluate(model, norm, x_train, x_valid, device)
        history.append(dict(epoch=epoch, train_loss=loss_sum / len(loader),
                            valid_rmse=valid["rmse"], valid_mae=valid["mae"],
                            seconds=time.perf_counter() - start))
        print(f"epoch {epoch}: train loss {history[-1]['train_loss']:.4f}, "
              f"validation RMSE {valid['rmse']:.4f}")
        if valid["rmse"] < best[0]:  # early stopping: keep the best epoch's weights
            best = (valid["rmse"], {k: v.clone() for k, v in model.state_dict().items()})
    if best[1] is not None:
        model.load_state_dict(best[1])
        print(f"kept epoch {min(history, key=lambda h: h['valid_rmse'])['epoch']}, "
              f"validation RMSE {best[0]:.4f}")
    return history


def recommend(args: argparse.Namespace, model: Autoencoder, norm: RatingNormalizer,
              x_train: torch.Tensor, ratings, device: torch.device) -> None:
    """Print the user's ``k`` best-predicted items among those they did not rate."""
    user_map = ratings.user_map
    key = next((c for c in (args.recommend, _int(args.recommend)) if c in user_map), None)
    if key is None:
        raise SystemExit(f"--recommend: user {args.recommend!r} is not in the data")
    user, items = user_map[key], norm.shape[0] if norm.orientation == "item" else norm.shape[1]
    model.eval()
    with torch.no_grad():
        if norm.orientation == "user":
            # the user's row through the model, in batches, the rated items left out
            row = x_train.to_sparse_coo().index_select(0, torch.tensor([user]))
            runner = nnsparse.Batchifier(model, items, device=device, progress=False)
            best = runner.topk(row, min(args.k, items), exclude=True)
            scores, index = best.values[0], best.indices[0]
            keep = scores.isfinite()  # fewer unrated items than k
            predicted = norm.denormalize(scores[keep], torch.full_like(index[keep], user))
            best = torch.return_types.topk((predicted, index[keep]))
        else:
            # every item's prediction for this user: the decoder sampled at one
            # column, (item, user) for all items, never the whole score matrix.
            pattern = torch.sparse_coo_tensor(
                torch.stack([torch.arange(items), torch.full((items,), user)]),
                torch.ones(items), (items, norm.shape[1])).to(device)
            scores = model(x_train.to(device), pattern).coalesce().values()
            predicted = norm.denormalize(scores, torch.arange(items, device=device))
            coo = x_train.to_sparse_coo().coalesce()
            predicted[coo.indices()[0][coo.indices()[1] == user].to(device)] = -math.inf
            best = torch.topk(predicted, min(args.k, items))
            keep = best.values.isfinite()
            best = torch.return_types.topk((best.values[keep], best.indices[keep]))
    item_ids = ratings.item_ids()
    print(f"top {best.indices.shape[0]} items for user {key}:")
    for score, item in zip(best.values.tolist(), best.indices.tolist()):
        title = ratings.titles[item] if ratings.titles else ""
        print(f"  {score:4.2f}  {item_ids[item]}  {title}")


def _int(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    split, ratings = load_split(args)
    norm = RatingNormalizer(split.train, orientation=args.orientation)
    x_train = norm.matrix(split.train)
    print(f"{len(ratings)} ratings, {ratings.n_users} users x {ratings.n_items} items; "
          f"train {len(split.train)}, validation {len(split.validation)}, test {len(split.test)}")
    model = Autoencoder(norm.shape[1], args.hidden).to(device)
    history: List[dict] = []
    if args.load:
        model.load_state_dict(torch.load(args.load, map_location=device))
    else:
        history = train(args, model, norm, x_train, norm.matrix(split.validation, False),
                        device)
    if args.save:
        torch.save(model.state_dict(), args.save)
    norm.to(device)
    test = evaluate(model, norm, x_train, norm.matrix(split.test, False), device)
    baseline = mean_prediction(split.train, split.test, by="item")
    base = {"rmse": float(rmse(baseline, split.test.rating)),
            "mae": float(mae(baseline, split.test.rating))}
    if args.recommend is not None:
        recommend(args, model, norm, x_train, ratings, device)
    result = dict(epochs=history, test_rmse=test["rmse"], test_mae=test["mae"],
                  item_mean_rmse=base["rmse"], item_mean_mae=base["mae"], args=vars(args))
    if args.metrics_out:
        with open(args.metrics_out, "w") as f:
            json.dump(result, f, indent=2)
    print(f"item-mean baseline: RMSE {base['rmse']:.4f}, MAE {base['mae']:.4f}")
    print(f"test MAE: {test['mae']:.4f}")
    print(f"test RMSE: {test['rmse']:.4f}")
    return result


if __name__ == "__main__":
    main()
