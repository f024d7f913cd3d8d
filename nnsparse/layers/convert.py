"""``Densify`` and ``Sparsify``: switch a network between sparse and dense batches."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .._lua import MODULE_MEMBERS, LuaMembers, setting_error
from .._forms import (SparseLike, as_count, as_sparse_batch, check_int64, compile_boundary, is_int,
                      sparse_output_boundary)
from ..convert import _check_elem, _densify, sparsify

__all__ = ["Densify", "Sparsify"]


def _check_in_features(in_features: Any) -> int:
    """``Densify``'s width: a non-negative int (numpy ints and 0-d integer tensors pass,
    as ``nn.Linear``'s sizes take them), as an int."""
    if isinstance(in_features, (Tensor, np.ndarray)):
        return as_count("in_features", in_features, 0, must="non-negative")
    if not is_int(in_features):
        raise TypeError(f"in_features must be a non-negative int, got "
                        f"{type(in_features).__name__} {in_features!r}")
    if in_features < 0:
        raise ValueError(f"in_features must be a non-negative int, got {in_features!r}")
    # the width of every output it makes
    check_int64(int(in_features), "in_features", "a non-negative int")
    return int(in_features)


class Densify(LuaMembers, nn.Module):
    r"""Turn a sparse batch into a dense ``(rows, in_features)`` one (the Lua ``nnsparse.Densify``).

    The layer form of :func:`nnsparse.densify`, for a network that densifies
    mid-way (e.g. before a dense layer on a GPU, where a GEMM beats sparse
    products at rating-data densities).

    Args:
        in_features (int): the width of the dense result; the input may be
            narrower (a pair tensor's width is its largest index + 1).
        elem (float): the value of unspecified entries; may be ``nan``. Default: 0.

    Shape:
        - Input: a sparse batch ``(rows, width)`` with ``width <= in_features``
          in any accepted form (COO, coalesced or not; CSR; a list of sparse
          vectors or of pair tensors), or a sparse vector ``(width,)`` / a
          ``(k, 2)`` pair tensor.
        - Output: dense ``(rows, in_features)``, or ``(in_features,)`` for a
          vector, with the input's dtype and device.  Duplicate entries sum.

    The input's values get a gradient, when they require one, at the
    specified entries only: ``grad_output[row, col]`` (each duplicate of an
    uncoalesced COO input gets the gradient of its position).

    Raises:
        TypeError: the input is not an accepted sparse form; ``in_features`` or
            ``elem`` (checked again at each call) is not a number.
        ValueError: the input is wider than ``in_features``, or has bad indices;
            ``in_features`` is negative; ``elem`` is a 0-d tensor that requires
            grad where grad is enabled (its number fills: no gradient reaches it).

    Example::

        >>> layer = nnsparse.Densify(4)
        >>> layer
        Densify(in_features=4)
        >>> layer([torch.tensor([[0., 2.], [3., 5.]]), torch.tensor([[1., 7.]])])
        tensor([[2., 0., 0., 5.],
                [0., 7., 0., 0.]])
    """

    _LUA_MEMBERS = {**MODULE_MEMBERS, "inputSize": "in_features"}  # Lua's Densify(inputSize)

    def __init__(self, in_features: int, elem: float = 0) -> None:
        super().__init__()
        self.in_features: int = _check_in_features(in_features)  # a numpy int as an int
        self.elem: float = _check_elem(elem, fill=True)

    @compile_boundary
    def forward(self, input: SparseLike) -> Tensor:
        # the settings again, as Sparsify's: they may have been assigned since __init__
        # (a str width failed with "'<' not supported between instances of 'str' and 'int'")
        in_features, elem = _check_in_features(self.in_features), _check_elem(self.elem, True)
        batch = as_sparse_batch(input, name="input", width=in_features, bound="in_features")
        return _densify(batch, elem, batch.rows, in_features, "input")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "inputSize":  # Lua's field: an attribute of that name would change nothing
            raise setting_error(self, name, "in_features", "layer")
        super().__setattr__(name, value)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}" + (f", elem={self.elem}" if self.elem != 0 else "")


class Sparsify(LuaMembers, nn.Module):
    r"""Turn a dense batch into a sparse one, leaving out every ``elem``.

    The layer form of :func:`nnsparse.sparsify` and the inverse of
    :class:`Densify`: ``Densify(n + offset)(Sparsify(offset=offset)(x))`` is
    ``x`` shifted right by ``offset`` columns.

    Args:
        elem (float): the value that means "not specified"; may be ``nan``. Default: 0.
        offset (int): added to every column index; the width grows by it. Default: 0.
        layout (torch.layout): ``torch.sparse_coo`` (default) or, for a batch,
            ``torch.sparse_csr``.

    Shape:
        - Input: dense ``(rows, n)`` or ``(n,)``.
        - Output: a coalesced sparse tensor ``(rows, n + offset)`` or
          ``(n + offset,)`` of the chosen layout, on the input's device with
          its dtype.

    The input gets a gradient at the specified (kept) entries only; the
    entries equal to ``elem`` get zero.

    Raises:
        TypeError: the input is not a dense tensor, ``layout`` is not COO or CSR,
            or ``offset`` is not an int.
        ValueError: ``offset`` is negative, the input has more than two
            dimensions, or CSR is asked for a vector.

    Example::

        >>> layer = nnsparse.Sparsify(offset=1)
        >>> layer
        Sparsify(elem=0, offset=1)
        >>> layer(torch.tensor([[0., 3.], [2., 0.]])).to_dense()
        tensor([[0., 0., 3.],
                [0., 2., 0.]])
    """

    def __init__(self, elem: float = 0, offset: int = 0,
                 layout: torch.layout = torch.sparse_coo) -> None:
        super().__init__()
        # Checked here so that a bad layer fails when built, not at its first batch.
        offset = as_count("offset", offset, 0, must="non-negative")  # numpy ints pass
        if layout not in (torch.sparse_coo, torch.sparse_csr):
            raise TypeError(f"layout must be torch.sparse_coo or torch.sparse_csr, got {layout}")
        self.elem: float = _check_elem(elem)
        self.offset: int = offset
        self.layout: torch.layout = layout

    @sparse_output_boundary
    def forward(self, input: Tensor) -> Tensor:
        return sparsify(input, self.elem, self.offset, self.layout)

    def extra_repr(self) -> str:
        elem = "nan" if isinstance(self.elem, float) and math.isnan(self.elem) else self.elem
        text = f"elem={elem}, offset={self.offset}"
        return text + (", layout=torch.sparse_csr" if self.layout == torch.sparse_csr else "")
