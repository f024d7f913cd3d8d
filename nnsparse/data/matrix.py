"""Rating matrices: orientation, normalisation to [-1, 1], per-row centring, errors.

An item autoencoder (I-AutoRec, the Lua CFN tutorial) reads one *item* per
row, the ratings its users gave it as the row's entries: the ``"item"``
orientation builds the ``(n_items, n_users)`` matrix, ``"user"`` its
transpose.  :class:`RatingNormalizer` is fitted on the training ratings only:
it maps ratings to ``[-1, 1]`` with the scale read from them, subtracts each
row's training mean, and maps predictions back, clipped to the scale.

Missing ratings are the *unspecified* entries of the sparse matrix, never the
entries whose value is 0: a rating equal to its row's mean becomes 0 after
centring and stays a specified entry.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import Tensor

from .._forms import (SparseBatch, as_choice, as_device, as_flag, as_sparse_batch,
                      check_index_range, check_numel, int_dtype, is_int, is_real, real_float,
                      refuse_meta, refuse_meta_device)
from .readers import (Ratings, _check_ratings, _check_unique_pairs, _distinct_index,
                      _isin_argument, _positions, _refuse_repeated_keys, _refuse_uint8_index)

__all__ = ["rating_matrix", "RatingNormalizer", "RatingErrors", "rmse", "mae", "mean_prediction"]

_ORIENTATIONS = ("item", "user")


def _check_orientation(orientation: str, name: str = "orientation") -> None:
    prefix = "" if name == "orientation" else f"{name}: "  # the argument, then the rule
    as_choice(orientation, f"{prefix}orientation", _ORIENTATIONS, "'item' or 'user'")



def _index(ratings: Ratings, orientation: str) -> Tuple[Tensor, Tensor, Tuple[int, int]]:
    """``(row, col, shape)`` of the entries in the given orientation."""
    if orientation == "item":
        return ratings.item, ratings.user, (ratings.n_items, ratings.n_users)
    return ratings.user, ratings.item, (ratings.n_users, ratings.n_items)


def _check_same_maps(ratings: Ratings, reference: Ratings, name: str, ref_name: str) -> None:
    """``ValueError`` unless ``ratings`` index ids as ``reference`` does (extra ids may follow).

    The parts of one split share the maps (an identity test); other records
    are compared id by id."""
    for what in ("user", "item"):
        mapping, ref = getattr(ratings, f"{what}_map"), getattr(reference, f"{what}_map")
        if mapping is ref:
            continue
        for key, index in ref.items():
            if mapping.get(key) != index:
                raise ValueError(
                    f"{name} must index {what}s as in {ref_name} ({what} {key!r} is {what} "
                    f"{index} there, {mapping.get(key)!r} here); read both with read_split "
                    f"or split them from one Ratings")


def _check_rows(row: Any, rows: int, name: str = "row") -> Tensor:
    """``row``: an integer tensor of matrix rows in ``[0, rows)`` (one host sync).

    Returns it as int64 when it was int8 or int16 (torch indexes with neither);
    uint8 is refused, since torch would read it as a mask.
    """
    if not isinstance(row, Tensor):
        raise TypeError(f"{name} must be an integer tensor, got {type(row).__name__}")
    _refuse_uint8_index(row, name, "an int64 tensor of matrix rows", ".long()")
    if not int_dtype(row.dtype):
        raise TypeError(f"{name} must be an integer tensor, got {row.dtype}")
    refuse_meta(row, name)  # its range cannot be read
    check_index_range(row, rows, f"{name} indices")
    return row if row.dtype in (torch.int32, torch.int64) else row.long()


def _check_broadcast(values: Tensor, row: Tensor, name: str) -> None:
    try:
        torch.broadcast_shapes(values.shape, row.shape)  # type: ignore[no-untyped-call]
    except RuntimeError:
        raise ValueError(f"{name} and row must have one shape or broadcast, got "
                         f"{tuple(values.shape)} and {tuple(row.shape)}") from None
    if row.device != values.device:
        raise ValueError(f"row must be on {name}'s device {values.device}, got {row.device}")


def _check_values_arg(values: Any, name: str) -> None:
    if not isinstance(values, Tensor) or values.layout != torch.strided:
        got = f"layout {values.layout}" if isinstance(values, Tensor) else type(values).__name__
        raise TypeError(f"{name} must be a dense tensor, got {got}")
    if values.dtype == torch.bool or values.is_complex():
        raise TypeError(f"{name} must hold real numbers, got dtype {values.dtype}")


def _matrix_shape(shape: Any) -> Tuple[int, int]:
    """A ``(rows, width)`` given for a rating matrix: two non-negative ints (numpy ints
    pass) whose product stays within int64 elements, as torch's sparse tensors need."""
    if not isinstance(shape, (tuple, list, torch.Size)) or any(
            not is_int(s) for s in shape):  # (not a numpy timedelta64)
        raise TypeError(f"shape must be two non-negative ints (rows, width), got {shape!r}")
    if len(shape) != 2 or any(s < 0 for s in shape):
        raise ValueError(f"shape must be two non-negative ints (rows, width), got {shape!r}")
    rows, width = check_numel(shape, "shape")
    return rows, width


def _row_positions(row: Tensor, picked: Tensor, order: Tensor, bound: int, orientation: str,
                   rows: str) -> Tensor:
    """The position in ``picked`` (distinct row indices in ``[0, bound)``, sorted by
    ``order``) of each entry's ``row`` (:func:`_positions`: a table of ``bound`` where it
    is no larger than the indices to place, else a binary search: no work of the id map's
    size beyond them); ``ValueError`` naming the first row of an entry that ``picked``
    lacks, its fix with ``rows`` (the argument as ``torch.isin`` takes it)."""
    position, found = _positions(picked, order, row, bound)
    if row.numel() and not bool(found.all()):
        missing = torch.unique(row[~found])
        more = missing.numel() - 1
        others = f", nor for {more} other {orientation}{'s' if more > 1 else ''}" if more else ""
        raise ValueError(f"rows must hold every {orientation} of the ratings, got no row for "
                         f"{orientation} {int(missing[0])}{others}; select the ratings of "
                         f"rows first: ratings.subset(torch.isin(ratings.{orientation}, {rows}))")
    return position.to(row.dtype)


def rating_matrix(ratings: Ratings, orientation: str = "item", values: Optional[Tensor] = None,
                  layout: torch.layout = torch.sparse_csr,
                  shape: Optional[Tuple[int, int]] = None, *, rows: Any = None) -> Tensor:
    r"""The sparse rating matrix, one row per item (``"item"``) or per user (``"user"``).

    Every row of the id map has its row (an empty one for a user or item without
    ratings), unless ``rows`` names the rows to build: the matrix of some users only,
    such as the held-out users of :func:`~nnsparse.data.user_split`, whose rows are then
    all filled, so a ``'batchmean'`` loss or a per-row mean is not diluted by the other
    users' empty rows.

    Args:
        ratings (Ratings): the entries.
        orientation (str): ``"item"`` (default) gives ``(n_items, n_users)``,
            the input of an item autoencoder; ``"user"`` gives
            ``(n_users, n_items)``.
        values (Tensor, optional): ``(len(ratings),)`` values to store instead
            of ``ratings.rating`` (e.g. normalised ratings).
        layout (torch.layout): ``torch.sparse_csr`` (default) or ``torch.sparse_coo``.
        shape (tuple, optional): ``(rows, width)``; default from the id maps.  With
            ``rows``, its first size must be ``len(rows)``: ``shape`` then sets (or
            checks) the width only.
        rows (Tensor or sequence, optional): keyword only.  The row indices to build
            (users for ``"user"``, items for ``"item"``, as ``Ratings.user`` and
            ``Ratings.item`` hold them): a 1-D integer tensor on the ratings' device, or
            a sequence of ints, each once, in ``[0, n_users)`` (``[0, n_items)``).  Row
            ``j`` of the matrix holds the ratings of ``rows[j]``, in any order of
            ``rows``; every rating must belong to one of them (select the others out
            first: ``ratings.subset(torch.isin(ratings.user, torch.as_tensor(rows)))``).
            O(nnz log nnz + len(rows) log len(rows)), whatever the size of the id maps.
            Default: every row of the id maps, in index order.

    Returns:
        A coalesced sparse tensor on the ratings' device; every rating is a
        specified entry, whatever its value.

    Raises:
        ValueError: an unknown ``orientation``, an index outside ``shape``, a
            ``shape`` of another length than two or with a negative size, or a
            (user, item) pair rated twice; ``rows`` not 1-D, an index in it out of
            range or given twice, on another device than the ratings (or the meta
            device), a rating of a row not in it, or a ``shape`` whose first size is
            not ``len(rows)``.
        TypeError: ``orientation`` not a str, ``layout`` not one of the two
            sparse layouts, ``shape`` not a sequence of ints; ``rows`` not an integer
            tensor or a sequence of ints (a bool or uint8 tensor too).

    Example::

        >>> r = Ratings.from_triples([0, 0, 1], [5, 6, 6], [4., 0., 2.])
        >>> m = rating_matrix(r, "item")
        >>> m.shape, m.crow_indices(), m.col_indices(), m.values()
        (torch.Size([2, 2]), tensor([0, 1, 3]), tensor([0, 0, 1]), tensor([4., 0., 2.]))
        >>> held = Ratings.from_triples([0, 1, 2, 3], [5, 5, 6, 5], [1., 1., 1., 1.])
        >>> part = held.subset(torch.isin(held.user, torch.tensor([3, 1])))  # users 3, 1
        >>> rating_matrix(part, "user", rows=[3, 1]).to_dense()  # row 0: user 3, 1: user 1
        tensor([[1., 0.],
                [1., 0.]])
        >>> rating_matrix(part, "user").shape  # one row per user of the map, two empty
        torch.Size([4, 2])
    """
    _check_ratings(ratings, "ratings")
    _check_orientation(orientation)
    if layout not in (torch.sparse_csr, torch.sparse_coo):
        raise TypeError(f"layout must be torch.sparse_csr or torch.sparse_coo, got {layout}")
    row, col, default = _index(ratings, orientation)
    picked: Optional[Tensor] = None  # the row index of each matrix row, when rows= is given
    picked_order: Optional[Tensor] = None  # the permutation that sorts picked
    if rows is not None:
        picked, picked_order = _distinct_index(rows, "rows", default[0], orientation)
        if not isinstance(rows, Tensor):  # a sequence: made on the ratings' device
            picked, picked_order = picked.to(row.device), picked_order.to(row.device)
        if picked.device != row.device:
            raise ValueError(f"rows must be on the ratings' device {row.device}, "
                             f"got {picked.device}")
    if shape is not None:
        shape = _matrix_shape(shape)
        if picked is not None and shape[0] != picked.shape[0]:
            raise ValueError(f"shape must have len(rows) = {picked.shape[0]} rows when rows "
                             f"is given (it sets the width only), got {shape}")
    n_rows, width = default if shape is None else shape
    if picked is not None:
        n_rows = picked.shape[0]
    values = ratings.rating if values is None else values
    if not isinstance(values, Tensor) or values.layout != torch.strided:
        got = f"layout {values.layout}" if isinstance(values, Tensor) else type(values).__name__
        raise TypeError(f"values must be a dense tensor, got {got}")
    if values.shape != row.shape:
        raise ValueError(f"values must have shape {tuple(row.shape)}, got {tuple(values.shape)}")
    if values.dtype == torch.bool or values.is_complex():
        raise TypeError(f"values must be real numbers, got dtype {values.dtype}")
    if values.device != row.device:
        raise ValueError(f"values must be on the ratings' device {row.device}, "
                         f"got {values.device}")
    if values.is_floating_point() and values.numel() and not bool(torch.isfinite(values).all()):
        raise ValueError("values must be finite, got NaN or inf; a rating matrix specifies "
                         "observed ratings only")
    checked = (("column", col, width),) if picked is not None else (
        ("row", row, n_rows), ("column", col, width))  # (rows=: each row is found in it)
    for name, index, bound in checked:
        # the minimum too: the record's tensors may have been edited in place since it was
        # checked, and a negative index entered the trusted matrix (a matmul's crash)
        lo, hi = torch.stack(torch.aminmax(index)).tolist() if index.numel() else (0, -1)
        if lo < 0 or hi >= bound:
            what = f"min {lo}" if lo < 0 else f"max {hi}"
            raise ValueError(f"{orientation} matrix {name} indices must be in [0, {bound}), got "
                             f"{what}; build the matrix with the maps of all parts")
    if picked is not None and picked_order is not None:
        fix = _isin_argument(rows, "rows", row.device)  # rows in the refusal's fix
        row = _row_positions(row, picked, picked_order, default[0], orientation, fix)
    key, order = torch.sort(row * width + col)
    source = f" from {ratings.source}" if ratings.source else ""

    def pair_of(k: int) -> Tuple[int, int]:  # (user, item) of a key
        row, col = divmod(k, width)
        if picked is not None:
            row = int(picked[row])
        return (col, row) if orientation == "item" else (row, col)
    if not ratings._known_unique():  # else checked once already (_check_unique_pairs)
        _refuse_repeated_keys(f"ratings{source}", ratings, key, pair_of)
    # checked above: the matrix is built trusted, its structure attached
    batch = SparseBatch(row[order], col[order], values[order], (n_rows, width), "coo",
                        row_sorted=True, coalesced=True, trusted=True)
    return batch.to_coo() if layout == torch.sparse_coo else batch.to_csr()


class RatingNormalizer:
    r"""Map ratings to ``[-1, 1]``, centre each row on its training mean, and back.

    Fitted on the training ratings only.  With scale ``(lo, hi)`` read from
    them, a rating ``r`` of row ``i`` becomes

    .. math::
        x = \frac{2 (r - lo)}{hi - lo} - 1 - m_i,

    where :math:`m_i` is the mean of row ``i``'s mapped training ratings (the
    global mean for rows without training ratings; 0 with ``center=False``).
    :meth:`denormalize` inverts this and clips to ``[lo, hi]``.

    Args:
        train (Ratings): the training ratings.
        orientation (str): ``"item"`` (rows are items; default) or ``"user"``.
        center (bool): subtract the per-row training mean.  Default: ``True``.
        scale (tuple, optional): ``(lo, hi)``; default: the min and max of
            ``train.rating`` (not assumed 1..5).

    Attributes:
        shape (tuple): ``(rows, width)`` of the matrices it builds.
        scale (tuple): ``(lo, hi)``.
        row_mean (Tensor): float32 ``(rows,)``, the per-row means on the
            ``[-1, 1]`` scale.
        global_mean (float): the mean of all mapped training ratings.

    Raises:
        ValueError: empty ``train``, a (user, item) pair rated twice in ``train``,
            ``lo >= hi``, an unknown ``orientation``, a ``scale`` of another
            length than two, not finite or narrower than the training ratings.
        TypeError: ``orientation`` not a str, ``scale`` not a tuple or list of
            real numbers, ``center`` not a bool.

    Example::

        >>> train = Ratings.from_triples([0, 1, 0], [0, 0, 1], [1., 5., 3.])
        >>> norm = RatingNormalizer(train, "item")
        >>> norm.scale, norm.row_mean
        ((1.0, 5.0), tensor([0., 0.]))
        >>> x = norm.matrix(train)          # item 1's only rating is 0 after centring
        >>> x.values()
        tensor([-1.,  1.,  0.])
        >>> norm.denormalize(torch.tensor([1.5, -0.5]), torch.tensor([0, 1]))
        tensor([5., 2.])
    """

    def __init__(self, train: Ratings, orientation: str = "item", center: bool = True,
                 scale: Optional[Tuple[float, float]] = None) -> None:
        _check_ratings(train, "train")
        _check_orientation(orientation)
        if len(train) == 0:
            raise ValueError("train holds no ratings; the normaliser needs some to fit")
        # a pair rated twice would weigh twice in its row mean (and matrix() refuses it)
        _check_unique_pairs("train", train)
        center = as_flag(center, "center")
        data_lo, data_hi = train.scale
        if scale is None:
            lo, hi = data_lo, data_hi
        else:
            if not isinstance(scale, (tuple, list)) or any(
                    not is_real(v) for v in scale):  # (nor a numpy timedelta64)
                raise TypeError(f"scale must be a pair of numbers (min, max), got {scale!r}")
            if len(scale) != 2:
                raise ValueError(f"scale must be a pair of numbers (min, max), got {scale!r}")
            lo, hi = real_float(scale[0]), real_float(scale[1])  # (10**400: inf, refused)
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise ValueError(f"scale must be finite, got ({lo}, {hi})")
            if lo < hi and not lo <= data_lo <= data_hi <= hi:
                raise ValueError(f"scale must contain the training ratings' range "
                                 f"[{data_lo}, {data_hi}], got ({lo}, {hi})")
        if not lo < hi:
            raise ValueError(f"scale must have min < max, got ({lo}, {hi}); "
                             "pass scale= when every rating is equal")
        self.orientation, self.center, self.scale = orientation, bool(center), (lo, hi)
        if train.rating.requires_grad:  # data: a graph kept here refused deepcopy, and
            # the row means held it (a rating tensor computed in a graph, a leaf's too)
            train = dataclasses.replace(train, rating=train.rating.detach())
        self._train = train  # its maps: the parts this normaliser reads must share them
        row, _, self.shape = _index(train, orientation)
        mapped = self._map(train.rating.to(torch.float32))
        self.global_mean = float(mapped.mean())
        counts = torch.bincount(row, minlength=self.shape[0]).to(mapped.dtype)
        sums = mapped.new_zeros(self.shape[0]).index_add_(0, row, mapped)
        if center:
            self.row_mean = torch.where(counts > 0, sums / counts.clamp(min=1),
                                        mapped.new_tensor(self.global_mean))
        else:
            self.row_mean = mapped.new_zeros(self.shape[0])

    def __repr__(self) -> str:
        return (f"RatingNormalizer(orientation={self.orientation!r}, shape={self.shape}, "
                f"scale={self.scale}, center={self.center})")

    def _map(self, rating: Tensor) -> Tensor:
        lo, hi = self.scale
        return (rating - lo) * (2.0 / (hi - lo)) - 1.0

    def _means(self, row: Tensor, like: Tensor) -> Tensor:
        return self.row_mean.to(device=like.device, dtype=like.dtype)[row]

    def to(self, device: Union[str, torch.device]) -> "RatingNormalizer":
        """Move the row means to ``device`` (in place; returns ``self``)."""
        device = as_device(device)
        refuse_meta_device(device)  # the means would be lost: every later call fails
        self.row_mean = self.row_mean.to(device)
        return self

    def index(self, ratings: Ratings) -> Tuple[Tensor, Tensor]:
        """``(row, col)`` int64 ``(n,)`` of each rating in this orientation."""
        _check_ratings(ratings, "ratings")
        _check_same_maps(ratings, self._train, "ratings", "the training ratings")
        row, col, _ = _index(ratings, self.orientation)
        return row, col

    def normalize(self, rating: Tensor, row: Tensor) -> Tensor:
        """Ratings of rows ``row`` (same or broadcastable shape) on the centred ``[-1, 1]`` scale."""
        _check_values_arg(rating, "rating")
        row = _check_rows(row, self.shape[0])
        _check_broadcast(rating, row, "rating")
        if not rating.is_floating_point():  # integer ratings (1..5) read as float32
            rating = rating.to(torch.float32)
        return self._map(rating) - self._means(row, rating)

    def denormalize(self, values: Tensor, row: Tensor) -> Tensor:
        """Normalised values back on the rating scale, clipped to it.

        ``row`` gives each value's matrix row: shape ``values.shape``, or
        ``(batch, 1)`` for a dense ``(batch, width)`` output.  Differentiable
        in ``values`` (inside the scale); dtype and device of ``values``.
        """
        _check_values_arg(values, "values")
        row = _check_rows(row, self.shape[0])
        _check_broadcast(values, row, "values")
        if not values.is_floating_point():
            values = values.to(torch.float32)
        lo, hi = self.scale
        rating = (values + self._means(row, values) + 1.0) * ((hi - lo) / 2.0) + lo
        return rating.clamp(lo, hi)

    def matrix(self, ratings: Ratings, normalize: bool = True,
               layout: torch.layout = torch.sparse_csr) -> Tensor:
        """The ``self.shape`` sparse matrix of ``ratings`` (any part of the split).

        Normalised values by default; ``normalize=False`` keeps the original
        ratings (the target for errors on the rating scale).  See
        :func:`rating_matrix`.
        """
        _check_ratings(ratings, "ratings")
        normalize = as_flag(normalize, "normalize")
        values = ratings.rating
        if normalize:
            row, _ = self.index(ratings)
            values = self.normalize(values.to(torch.float32), row)
        return rating_matrix(ratings, self.orientation, values, layout, self.shape)

    def predict_entries(self, output: Any, rows: Tensor, target: Any) -> Tuple[Tensor, Tensor]:
        """Predictions on the rating scale at the specified entries of ``target``.

        Args:
            output: ``(batch, width)`` model output on the normalised scale:
                dense, or sparse (COO, CSR; the output of a
                :class:`~nnsparse.SparseOutputLinear` given ``target`` as its
                pattern, which never forms the dense output) specifying every
                entry of ``target``.
            rows (Tensor): int64 ``(batch,)``, the matrix row of each batch row.
            target: any sparse form of shape ``(batch, width)``, usually a
                batch of ``matrix(test, normalize=False)``.

        Returns:
            ``(prediction, target_values)``, both ``(nnz,)`` in the target's
            entry order: feed them to :class:`RatingErrors` or :func:`rmse`.

        Raises:
            ValueError: a sparse ``output`` that leaves out an entry of ``target``,
                or of another shape.
        """
        if isinstance(output, Tensor) and output.layout in (torch.sparse_coo, torch.sparse_csr):
            return self._predict_sparse_entries(output, rows, target)
        if isinstance(output, Tensor) and output.layout != torch.strided:  # CSC, BSR, BSC
            raise TypeError(f"output must be a dense tensor or a sparse COO or CSR tensor, "
                            f"got layout {output.layout}")
        _check_values_arg(output, "output")
        if output.dim() != 2:
            raise ValueError(f"output must be 2-D (batch, width), got shape {tuple(output.shape)}")
        refuse_meta(output, "output")
        _check_output_rows(rows, output.shape[0])
        batch = as_sparse_batch(target, name="target", width=output.shape[-1])
        if batch.rows != output.shape[0]:
            raise ValueError(f"target must have {output.shape[0]} rows like output, "
                             f"got {batch.rows}")
        picked = output[batch.row, batch.col]
        return self.denormalize(picked, rows.to(output.device)[batch.row]), batch.values

    def _predict_sparse_entries(self, output: Tensor, rows: Tensor,
                                target: Any) -> Tuple[Tensor, Tensor]:
        """:meth:`predict_entries` of a sparse output, read at the target's entries as the
        criteria read a sparse estimate (its values directly when it shares the target's
        index tensors, as a decoder given the target as its pattern makes it)."""
        from ..criteria._entries import as_estimate

        if output.dim() != 2:
            raise ValueError(f"output must be 2-D (batch, width), got shape {tuple(output.shape)}")
        refuse_meta(output, "output")
        if output.dense_dim() != 0:  # (the criteria's reader would name an "estimate")
            raise NotImplementedError(f"output: hybrid sparse tensors are not supported, got "
                                      f"dense_dim {output.dense_dim()}")
        if output.dtype == torch.bool or output.is_complex():  # as a dense output's
            raise TypeError(f"output must hold real numbers, got dtype {output.dtype}")
        _check_output_rows(rows, output.shape[0])
        if isinstance(target, Tensor) and target.device != output.device:
            raise ValueError(f"target must be on the output's device {output.device}, "
                             f"got {target.device}")
        batch = as_sparse_batch(target, name="target", width=output.shape[-1])
        if batch.rows != output.shape[0]:
            raise ValueError(f"target must have {output.shape[0]} rows like output, "
                             f"got {batch.rows}")
        est = as_estimate(output, target)
        if est.shared is not None:  # the output's values pair with the target's entries
            picked = est.shared
        else:
            try:
                picked = est.at(batch.row, batch.col)
            except ValueError as e:  # the criteria's message names an estimate
                raise ValueError(f"a sparse output must specify every entry of the target; "
                                 f"{str(e).split('; ', 1)[1]}") from None
        return self.denormalize(picked, rows.to(output.device)[batch.row]), batch.values


def _check_pair(prediction: Tensor, target: Tensor) -> None:
    for name, t in (("prediction", prediction), ("target", target)):
        if not isinstance(t, Tensor) or t.layout != torch.strided:
            got = f"layout {t.layout}" if isinstance(t, Tensor) else type(t).__name__
            raise TypeError(f"{name} must be a dense tensor, got {got}")
        if t.dtype == torch.bool or t.is_complex():
            raise TypeError(f"{name} must hold real numbers, got dtype {t.dtype}")
    if prediction.shape != target.shape:
        raise ValueError(f"prediction and target must have one shape, got "
                         f"{tuple(prediction.shape)} and {tuple(target.shape)}")
    if prediction.device != target.device:
        raise ValueError(f"prediction and target must be on one device, got "
                         f"{prediction.device} and {target.device}")


def _errors(prediction: Tensor, target: Tensor) -> Tuple[Tensor, torch.dtype]:
    """``prediction - target`` in a floating dtype (integer ratings pass), never empty, and
    the dtype of the result to return.

    The difference and what is summed of it are computed in at least float32:
    in float16 the square of an error of 300 (90000) is inf, and so was the
    RMSE; in bfloat16 a sum of many squares stops growing.  The result is cast
    back to the inputs' (floating) dtype.
    """
    _check_pair(prediction, target)
    if prediction.numel() == 0:
        raise ValueError("prediction and target are empty; an error needs at least one entry")
    dtype = torch.promote_types(prediction.dtype, target.dtype)
    if not dtype.is_floating_point:  # cast first: uint8 0 - 255 wrapped to 1, int8 too
        dtype = torch.get_default_dtype()
    work = torch.promote_types(dtype, torch.float32)
    return prediction.to(work) - target.to(work), dtype


def rmse(prediction: Tensor, target: Tensor) -> Tensor:
    """Root mean squared error of two tensors of one shape (usually ``(n,)`` ratings).

    Computed in at least float32 (a float16 error of 300 squares beyond float16),
    returned in the inputs' floating dtype (the default dtype for integer ones).

    Args:
        prediction (Tensor): dense, any shape; integer or floating point.
        target (Tensor): dense, ``prediction``'s shape and device.

    Returns:
        Tensor: 0-dim, in the inputs' promoted floating dtype.

    Raises:
        TypeError: an argument that is not a dense tensor, or holds bool or complex
            values.
        ValueError: shapes or devices differ, or no entries (an error of nothing).

    Example::

        >>> rmse(torch.tensor([3., 4.]), torch.tensor([4., 4.]))
        tensor(0.7071)
    """
    errors, dtype = _errors(prediction, target)
    return errors.square().mean().sqrt().to(dtype)


def mae(prediction: Tensor, target: Tensor) -> Tensor:
    """Mean absolute error of two tensors of one shape (usually ``(n,)`` ratings).

    Computed in at least float32 (in float16, 40000 - (-40000) overflows to inf),
    returned in the inputs' floating dtype (the default dtype for integer ones).

    Args:
        prediction (Tensor): dense, any shape; integer or floating point.
        target (Tensor): dense, ``prediction``'s shape and device.

    Returns:
        Tensor: 0-dim, in the inputs' promoted floating dtype.

    Raises:
        TypeError: an argument that is not a dense tensor, or holds bool or complex
            values.
        ValueError: shapes or devices differ, or no entries (an error of nothing).

    Example::

        >>> mae(torch.tensor([3., 4.]), torch.tensor([4., 4.]))
        tensor(0.5000)
    """
    errors, dtype = _errors(prediction, target)
    return errors.abs().mean().to(dtype)


class RatingErrors:
    """Accumulates squared and absolute errors over batches, on their device.

    Nothing is read back until :meth:`compute` (one sync).

    Example::

        >>> errors = RatingErrors()
        >>> errors.update(torch.tensor([3., 4.]), torch.tensor([4., 4.]))
        >>> errors.update(torch.tensor([1.]), torch.tensor([2.]))
        >>> {k: round(v, 4) for k, v in errors.compute().items()}
        {'rmse': 0.8165, 'mae': 0.6667, 'count': 3}
    """

    def __init__(self) -> None:
        self._sums: Optional[Tensor] = None

    def update(self, prediction: Tensor, target: Tensor) -> None:
        _check_pair(prediction, target)
        refuse_meta(prediction, "prediction")  # compute() reads the sums back
        if self._sums is not None and self._sums.device != prediction.device:
            raise ValueError(f"prediction must be on the device of the earlier updates, "
                             f"{self._sums.device}, got {prediction.device}")
        # float64 first: an integer difference wraps (uint8 0 - 255 is 1)
        error = prediction.detach().to(torch.float64) - target.detach().to(torch.float64)
        sums = torch.stack([error.square().sum(), error.abs().sum(),
                            error.new_tensor(float(error.numel()))])
        self._sums = sums if self._sums is None else self._sums + sums

    def compute(self) -> Dict[str, float]:
        """``{"rmse", "mae", "count"}``; raises ``ValueError`` before any update."""
        if self._sums is None or float(self._sums[2]) == 0:
            raise ValueError("RatingErrors has no entries; call update() first")
        square, absolute, count = self._sums.tolist()
        return {"rmse": (square / count) ** 0.5, "mae": absolute / count, "count": int(count)}


def mean_prediction(train: Ratings, test: Ratings, by: str = "item") -> Tensor:
    r"""The baseline that predicts each test rating by its item's (or user's) training mean.

    Rows without training ratings get the global training mean.

    Args:
        train (Ratings): the training ratings.
        test (Ratings): the entries to predict, sharing ``train``'s maps.
        by (str): ``"item"`` (default) or ``"user"``.

    Returns:
        Tensor: float32 ``(len(test),)``, on the original rating scale.

    Raises:
        TypeError: ``train`` or ``test`` is not a :class:`Ratings`, ``by`` is
            not a str.
        ValueError: ``by`` is neither ``"item"`` nor ``"user"``; ``train`` holds no
            ratings; ``test`` was read with other id maps than ``train``, or
            indexes rows beyond them.

    Example::

        >>> r = Ratings.from_triples([0, 1, 2, 2], [0, 0, 1, 0], [2., 4., 5., 1.])
        >>> train, test = r.subset(torch.tensor([0, 1, 2])), r.subset(torch.tensor([3]))
        >>> mean_prediction(train, test)
        tensor([3.])
        >>> rmse(mean_prediction(train, test), test.rating)
        tensor(2.)
    """
    _check_ratings(train, "train")
    _check_ratings(test, "test")
    _check_orientation(by, "by")
    if len(train) == 0:
        raise ValueError("train holds no ratings; the baseline needs some")
    row, _, shape = _index(train, by)
    rating = train.rating.to(torch.float32)
    sums = rating.new_zeros(shape[0]).index_add_(0, row, rating)
    counts = torch.bincount(row, minlength=shape[0]).to(rating.dtype)
    means = torch.where(counts > 0, sums / counts.clamp(min=1), rating.mean())
    _check_same_maps(test, train, "test", "train")
    test_row, _, _ = _index(test, by)
    if test_row.numel() and int(test_row.max()) >= shape[0]:
        raise ValueError(f"test {by} indices must be in [0, {shape[0]}), got max "
                         f"{int(test_row.max())}; read both parts with one pair of maps")
    return means[test_row]


def _check_output_rows(rows: Any, n: int) -> None:
    """``rows`` must be an int64 (or int32) ``(n,)`` tensor holding data: the matrix row
    of each of an output's ``n`` rows."""
    if not isinstance(rows, Tensor) or rows.dtype not in (torch.int64, torch.int32):
        got = rows.dtype if isinstance(rows, Tensor) else type(rows).__name__
        raise TypeError(f"rows must be an int64 tensor of matrix rows, got {got}")
    refuse_meta(rows, "rows")
    if rows.shape != (n,):
        raise ValueError(f"rows must have shape ({n},), one per output row, "
                         f"got {tuple(rows.shape)}")
