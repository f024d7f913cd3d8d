"""Rating data: readers, splits, rating matrices and their normalisation, datasets.

The pieces of a collaborative-filtering pipeline (see ``README.md``)::

    ratings = read_ratings(path)     # ml-1m/ratings.dat or ml-1m/; or synthetic_ratings(seed=0)
    # implicit feedback: clicks = implicit_clicks(ratings), then user_split(clicks, ...)
    train, valid, test = random_split(ratings, test=0.1, validation=0.05, seed=0)
    norm = RatingNormalizer(train, orientation="item")    # fitted on train only
    x = norm.matrix(train)                                # (n_items, n_users) CSR, in [-1, 1]
    ds = SparseRowDataset(x)                              # rows -> (indices, values)
    loader = DataLoader(ds, batch_size=32, shuffle=True, collate_fn=ds.collate)
"""
from .readers import (FORMATS, Ratings, detect_format, read_item_features, read_ratings,
                      read_split, read_user_features)
from .split import (HeldOut, Split, UserSplit, holdout_split, random_split, split_ratings,
                    user_split)
from .matrix import RatingErrors, RatingNormalizer, mae, mean_prediction, rating_matrix, rmse
from .synthetic import synthetic_item_features, synthetic_ratings
from .dataset import SparseRowBatch, SparseRowDataset, collate_sparse_rows
from .ranking import ranking_metrics
from .clicks import implicit_clicks

__all__ = [
    "FORMATS",
    "Ratings",
    "read_ratings",
    "read_split",
    "detect_format",
    "read_item_features",
    "read_user_features",
    "Split",
    "split_ratings",
    "random_split",
    "holdout_split",
    "user_split",
    "implicit_clicks",
    "UserSplit",
    "HeldOut",
    "rating_matrix",
    "RatingNormalizer",
    "RatingErrors",
    "rmse",
    "mae",
    "mean_prediction",
    "ranking_metrics",
    "synthetic_ratings",
    "synthetic_item_features",
    "SparseRowDataset",
    "SparseRowBatch",
    "collate_sparse_rows",
]
