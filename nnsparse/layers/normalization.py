"""``Normalize``: the layer form of :func:`nnsparse.normalize`, for ``nn.Sequential``."""
from __future__ import annotations

from typing import Union

from torch import nn

from .._forms import SparseLike, compile_boundary
from .._lua import LuaMembers
from .._ops import SparseParts
from ..values import _normalize_settings, normalize

__all__ = ["Normalize"]


class Normalize(LuaMembers, nn.Module):
    r"""Divide each row of a sparse batch by its :math:`L_p` norm (:func:`nnsparse.normalize`).

    The layer form of :func:`nnsparse.normalize`, for a network that normalises
    its input (Mult-VAE and Mult-DAE divide each user's row by its L2 norm
    before the encoder): each row's specified values become
    :math:`v / \max(\lVert v \rVert_p, \epsilon)`, the unspecified entries stay
    unspecified, in O(nnz) without densifying.  A dense input is given to
    ``F.normalize``, so the same network serves dense batches.

    Args:
        p (float): the exponent of the norm, ``> 0`` (``math.inf``: the largest
            ``|value|``).  Default: 2.
        dim (int): the dimension reduced: ``1`` or ``-1`` for a batch (each row on
            its own), ``0`` or ``-1`` for a sparse vector.  Default: 1.
        eps (float): the smallest divisor, which keeps a row of zeros finite.
            Default: 1e-12.

    Shape:
        - Input: a sparse batch ``(rows, width)`` in any accepted form (COO,
          coalesced or not; CSR; a list of sparse vectors or of pair tensors; a
          :class:`~nnsparse.SparseParts`), a sparse vector ``(width,)``, or a
          dense tensor of floating-point or complex values.
        - Output: the input's form, pattern, shape, dtype and device (an
          uncoalesced COO input's repeated positions summed first).

    Gradients flow to the input's specified values only (each value's gradient
    also comes through its row's norm).

    Raises:
        TypeError: ``p``, ``dim`` or ``eps`` is not a number (``dim``: not an int);
            in ``forward``, :func:`nnsparse.normalize`'s (an integer input...).
        ValueError: ``p`` or ``eps`` is NaN, or ``eps`` is negative.
        IndexError: in ``forward``, ``dim`` out of range for the input's dimensions.
        NotImplementedError: ``p <= 0`` (not a norm; also in ``forward``, if
            assigned since), or, in ``forward``, ``dim`` naming a sparse batch's
            columns (normalise the transpose).

    Example::

        >>> layer = nnsparse.Normalize()
        >>> layer
        Normalize(p=2.0, dim=1, eps=1e-12)
        >>> x = torch.tensor([[3., 0., 4.], [0., -2., 0.]]).to_sparse_csr()
        >>> layer(x).values()
        tensor([ 0.6000,  0.8000, -1.0000])
        >>> net = torch.nn.Sequential(layer, nnsparse.SparseLinearBatch(3, 2))
        >>> net(x).shape
        torch.Size([2, 2])
    """

    def __init__(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> None:
        super().__init__()
        # Checked here so that a bad layer fails when built (forward checks them again:
        # they may be assigned since); a numpy int or float is kept as Python's
        p, dim, eps = _normalize_settings(p, dim, eps)
        if p <= 0:  # (the function refuses it for every input: fail when built)
            raise NotImplementedError(f"Normalize takes p > 0 (a norm; math.inf for the "
                                      f"largest |value|), got p={p}")
        self.p: float = p
        self.dim: int = dim
        self.eps: float = eps

    @compile_boundary
    def forward(self, input: Union[SparseLike, SparseParts]) -> Union[SparseLike, SparseParts]:
        return normalize(input, self.p, self.dim, self.eps)

    def extra_repr(self) -> str:
        return f"p={self.p}, dim={self.dim}, eps={self.eps}"
