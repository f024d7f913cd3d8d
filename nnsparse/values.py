"""Element-wise functions on the values of a sparse batch, keeping its pattern.

The output of :class:`nnsparse.SparseOutputLinear` is a sparse tensor holding
a network's outputs at the target's specified entries; an activation such as
``tanh`` applies to those values, and the unspecified entries stay
unspecified (they are not outputs that were computed as 0, they are outputs
that were not computed).  This is masked semantics: ``sigmoid`` maps a
specified 0 to 0.5 and leaves unspecified entries alone.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from ._forms import _sparse_coo, _sparse_csr, as_sparse_batch

__all__ = ["values_map", "ValuesMap"]


def values_map(fn: Callable[[Tensor], Tensor], input: Any) -> Any:
    r"""Apply an element-wise function to the specified values of a sparse batch.

    Args:
        fn: a function mapping a 1-D tensor of values to one of the same shape
            (``torch.tanh``, ``torch.sigmoid``, ``nn.ReLU()``, a lambda...).
        input: a sparse batch or vector (torch COO or CSR, a list of sparse
            vectors or of pair tensors), or a dense tensor (then ``fn(input)``
            is returned; a lone pair tensor counts as dense: wrap it in a list).

    Returns:
        ``input`` with ``fn`` applied to its values, with the same positions:
        a COO tensor stays COO (coalesced first when it was not, since
        ``fn`` of a sum of duplicates is not the sum of ``fn``), a CSR tensor
        stays CSR with the same indices, a list or pair form keeps its form.
        Gradients flow to ``input``'s values only.

    Raises:
        TypeError: ``input`` is not a tensor or an accepted sparse form.
        ValueError: ``fn`` changed the number of values.

    Example::

        >>> x = torch.tensor([[0., 2.], [-1., 0.]]).to_sparse()
        >>> y = nnsparse.values_map(torch.sigmoid, x)
        >>> y.indices(), y.values()
        (tensor([[0, 1],
                [1, 0]]), tensor([0.8808, 0.2689]))
    """
    if isinstance(input, Tensor) and input.layout == torch.strided:
        # dense data (a dense decoder's output at inference); a lone (k, 2)
        # pair tensor cannot be told from a dense (rows, 2) batch: wrap it in a list
        return fn(input)
    if isinstance(input, Tensor) and input.layout == torch.sparse_csr:
        values = _mapped(fn, input.values())
        return _sparse_csr(input.crow_indices(), input.col_indices(), values, input.shape)
    batch = as_sparse_batch(input, name="input")
    if batch.form == "coo" and not batch.coalesced:
        batch = batch.coalesce()
    values = _mapped(fn, batch.values)
    if batch.form == "coo":
        index = batch.col.unsqueeze(0) if batch.is_vector else torch.stack([batch.row, batch.col])
        shape = (batch.width,) if batch.is_vector else batch.shape
        return _sparse_coo(index, values, shape, batch.coalesced)
    return batch.with_values(values)


def _mapped(fn: Callable[[Tensor], Tensor], values: Tensor) -> Tensor:
    out = fn(values)
    if not isinstance(out, Tensor) or out.shape != values.shape:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"fn must keep the values' shape {tuple(values.shape)}, got {got}")
    return out


class ValuesMap(nn.Module):
    r"""Apply a module or function to a sparse batch's values, or to a dense tensor.

    Lets element-wise modules (``nn.Tanh``, ``nn.Sigmoid``, ``nn.Dropout``...)
    sit after a layer whose output is sparse, e.g. inside ``nn.Sequential``;
    a dense input is passed to ``fn`` unchanged, so the same network serves
    sparse (training) and dense (inference) outputs.  See :func:`values_map`.

    Args:
        fn: an element-wise ``nn.Module`` (registered as a submodule) or callable.

    Example::

        >>> act = nnsparse.ValuesMap(torch.nn.Tanh())
        >>> act
        ValuesMap(
          (fn): Tanh()
        )
        >>> act(torch.tensor([[0., 1.], [0., 0.]]).to_sparse()).values()
        tensor([0.7616])
        >>> act(torch.zeros(2))
        tensor([0., 0.])
    """

    def __init__(self, fn: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, input: Any) -> Any:
        return values_map(self.fn, input)
