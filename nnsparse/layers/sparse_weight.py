"""``SparseWeightLinear``: a linear layer whose weight has a fixed sparsity pattern.

The weight ``W`` ``(out_features, in_features)`` keeps the positions given at
construction (a pruned network's connectivity, a graph's adjacency, a
structured layer); its non-zeros are the learnable parameter ``values``
``(nnz,)``.  Nothing of size ``out x in`` is ever made: the pattern is held
as CSR index tensors, the products are the sparse kernels of
:mod:`nnsparse.matmul`, and ``values`` gets its gradient at the pattern only.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union, cast

import torch
from torch import Tensor, nn
from torch.nn.modules.module import _IncompatibleKeys  # nn.Module.load_state_dict's type

from .._forms import (_check_csr, _version, as_count, as_device, as_flag, as_sparse_batch,
                      compile_boundary, dtype_got, int_dtype, is_int, is_real, is_sparse_form)
from .._load import check_state_dict, entry_errors
from .._lua import WEIGHT_MEMBERS, LuaMembers
from .. import _index
from ..matmul import _PatternMM
from ..values import _csr_with_values
from .linear import _check_not_narrower, _check_parameters, _has_bias, _parameter

__all__ = ["SparseWeightLinear"]

# The transient (chunk, in_features) scores random() draws a row block from.
_RANDOM_BLOCK = 1 << 22


def _check_density(density: Any) -> float:
    if not is_real(density):  # (not a bool, nor a numpy timedelta64)
        raise TypeError(f"density must be a real number, got {type(density).__name__} "
                        f"{density!r}")
    # a Real compares with numbers (mypy's numbers.Real has no operators)
    if not 0 < cast(float, density) <= 1:  # also refuses NaN
        raise ValueError(f"density must be in (0, 1], got {density}")
    return float(density)


def _index_dtype(*sizes: int) -> torch.dtype:
    """int32 indices (half the memory, accepted by every kernel used) when they fit."""
    return torch.int32 if max(sizes, default=0) < 2 ** 31 - 1 else torch.int64


class _SparseInputMM(torch.autograd.Function):
    """``X @ W.T`` for a sparse ``X`` and the sparse ``W``, on their joined entries.

    Every pair of an input entry ``(r, i)`` and a weight entry ``(o, i)`` adds
    ``x * w`` at output ``(r, o)``: ``key`` is ``r * out + o``, ``x_id`` and
    ``w_id`` say which entries meet.  The work and memory are the product's
    multiply count, never ``rows x in`` or ``out x in``.
    """

    # forward and setup_context apart: the form torch.func's transforms require
    @staticmethod
    def forward(w: Tensor, x: Tensor, key: Tensor, w_id: Tensor, x_id: Tensor,
                rows: int, out: int) -> Tensor:
        y = w.new_zeros(rows * out).index_add_(0, key, x[x_id] * w[w_id])
        return y.view(rows, out)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
        w, x, key, w_id, x_id, _, _ = inputs
        ctx.save_for_backward(w, x, key, w_id, x_id)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        # torch operators only: with create_graph=True (grad mode on) autograd records
        # them, and the second derivative is exact
        w, x, key, w_id, x_id = ctx.saved_tensors
        g = grad.reshape(-1)[key]
        grad_w = grad_x = None
        # the sums start from g's new_zeros, not w's or x's: under jacrev's vmap g is
        # batched, and an in-place sum of batched terms needs a batched start
        if ctx.needs_input_grad[0]:
            grad_w = g.new_zeros(w.shape).index_add_(0, w_id, g * x[x_id])
        if ctx.needs_input_grad[1]:
            grad_x = g.new_zeros(x.shape).index_add_(0, x_id, g * w[w_id])
        return grad_w, grad_x, None, None, None, None, None


class SparseWeightLinear(LuaMembers, nn.Module):
    r"""``y = x @ W.T + b`` with a fixed-pattern sparse weight ``W`` and learnable values.

    ``W`` has shape ``(out_features, in_features)`` and the positions of
    ``pattern``; its values are the parameter ``values`` ``(nnz,)``, one per
    position in row-major order (``layer.weight`` is ``W`` as a sparse CSR
    tensor).  Only ``values`` (and ``bias``) get gradients: ``values`` at the
    pattern's entries, ``(G.T @ x)[o, i]`` for each ``(o, i)``; the pattern
    never changes.  An input that requires grad gets its gradient too (dense
    for a dense input; at its specified entries for a sparse one).

    Memory is proportional to nnz: ``values`` and its gradient, the CSR
    pattern (``crow``, ``col``, saved in the ``state_dict``) and its
    transposed structure (derived, not saved; pointers over the used input
    columns only when ``in_features`` is 2 x nnz or more), int32 where sizes
    allow.  A sparse input of any width costs O(its nnz + the products).
    ``load_state_dict`` replaces the pattern by a saved one of the same nnz
    and refuses one of another nnz; a refused load changes nothing.

    Initialisation follows ``nn.Linear`` with the fan-in of each row: the
    values of row ``o`` and ``bias[o]`` are drawn from
    :math:`\mathcal{U}(-1/\sqrt{k_o}, 1/\sqrt{k_o})` where :math:`k_o` is
    the number of positions in row ``o`` (0 for an empty row).

    Args:
        pattern: the positions of ``W``, a 2-D sparse matrix ``(out_features,
            in_features)`` in any accepted form (COO, coalesced or not, CSR, a
            list of sparse rows or of pair tensors); its values are ignored
            (duplicates are one position; a specified zero is a position).
            See also :meth:`random` and :meth:`from_dense`.
        bias (bool): learn an additive bias.  Default: ``True``.
        device, dtype: of the parameters (the pattern moves to ``device``).

    Shape:
        - input: ``(*, in_features)`` dense, or ``(rows, in_features)`` /
          ``(in_features,)`` sparse in any accepted form.
        - output: ``(*, out_features)`` dense (``(rows, out_features)`` or
          ``(out_features,)`` for a sparse input).

    A sparse input is multiplied entry by entry with ``W`` (every input entry
    meets the weight entries of its column): work and memory are the number
    of such meetings.  When that number exceeds ``rows x in_features`` (a
    nearly dense input), the input is densified instead and the dense path
    runs, which is then the smaller of the two.  Counting the meetings reads
    one number back from the device.

    Raises:
        TypeError: ``pattern`` is not a sparse form; an input of the wrong kind.
        ValueError: ``pattern`` is not 2-D or has bad indices; an input's width,
            dtype or device differs from the layer's; ``values`` or ``bias`` was
            replaced by one of another shape than ``(nnz,)`` or
            ``(out_features,)``, or the bias differs from ``values`` in dtype or
            device (a ``TypeError`` for a non-dense one or ``None`` values).

    Example::

        >>> pattern = torch.tensor([[1., 0., 1.], [0., 1., 0.]]).to_sparse()
        >>> layer = nnsparse.SparseWeightLinear(pattern, bias=False)
        >>> layer
        SparseWeightLinear(in_features=3, out_features=2, nnz=3, bias=False)
        >>> with torch.no_grad():
        ...     layer.values.copy_(torch.tensor([1., 2., 3.]))
        Parameter containing:
        tensor([1., 2., 3.], requires_grad=True)
        >>> layer(torch.tensor([[1., 1., 1.]]))
        tensor([[3., 3.]], grad_fn=<...>)
        >>> sorted(layer.state_dict())
        ['col', 'crow', 'values']
    """

    # Lua members named in the AttributeError
    _LUA_MEMBERS = {**WEIGHT_MEMBERS, "reset": "reset_parameters() (no stdv)",
                    "gradWeight": "values.grad (the weight's specified values; filled by "
                                  "backward, accumulated until zero_grad())"}

    # buffers registered in __init__ / _derive (typed here: nn.Module's
    # __getattr__ would give Tensor | Module)
    crow: Tensor
    col: Tensor
    t_perm: Tensor
    t_cols: Tensor
    t_crow: Tensor
    t_row: Tensor
    bias: Optional[nn.Parameter]
    # True while this layer's own load_state_dict runs, after checking the state whole
    _refusals_checked = False

    def __init__(self, pattern: Any, bias: bool = True, *,
                 device: Optional[Union[torch.device, str, int]] = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        bias = as_flag(bias, "bias")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype_got(dtype)}")
        as_device(device, none=True)  # before the pattern is read
        if not is_sparse_form(pattern):
            raise TypeError("pattern must be a sparse matrix (COO, CSR, a list of sparse rows), "
                            f"got {_kind(pattern)}; use pattern.to_sparse() for a dense mask")
        batch = as_sparse_batch(pattern, name="pattern", pairs=False)
        if batch.is_vector:
            raise ValueError("pattern must be a 2-D sparse matrix (out_features, in_features), "
                             "got a sparse vector")
        batch = batch.coalesce()
        self.out_features, self.in_features = batch.shape
        device = device if device is not None else batch.device
        dtype = dtype if dtype is not None else torch.get_default_dtype()
        if not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype}")
        index = _index_dtype(self.out_features, self.in_features, batch.nnz)
        crow = batch.crow_indices()
        self.register_buffer("crow", crow.to(device=device, dtype=index))
        self.register_buffer("col", batch.col.detach().to(device=device, dtype=index))
        self.values = nn.Parameter(torch.empty(batch.nnz, device=device, dtype=dtype))
        self.bias = (nn.Parameter(torch.empty(self.out_features, device=device, dtype=dtype))
                     if bias else None)
        self._derive()
        self.register_load_state_dict_post_hook(_after_load)  # type: ignore[no-untyped-call]
        self.reset_parameters()

    def load_state_dict(self, state_dict: Any, strict: bool = True,
                        assign: bool = False) -> "_IncompatibleKeys":
        """``nn.Module.load_state_dict``, checked whole first: a refused load changes nothing.

        The pattern (``crow``, ``col``) is part of the state: a state of another
        pattern with the same nnz replaces the layer's pattern and values (and
        rebuilds the derived structure).  A state of another nnz is refused
        (``values`` keeps its shape, so an optimiser holding it stays valid):
        build a layer of the saved pattern instead.

        Raises:
            RuntimeError: (torch's type) an entry of the wrong shape (another
                nnz) or kind, a pattern of a non-integer dtype; with ``strict``,
                missing or unexpected keys.
            ValueError: a loaded pattern that is no valid CSR pattern; for a state
                without ``crow``/``col``, the layer's own pattern when it is none (edited
                in place, or from a file), before anything is copied.
        """
        if isinstance(state_dict, Mapping):
            refusals = self._refusals(state_dict, "")
            if refusals:
                raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:"
                                   "\n\t" + "\n\t".join(refusals) + "\n(nothing was loaded)")
        strict, assign = check_state_dict(self, state_dict, strict, assign)
        # _load_from_state_dict reads these same entries (its pre-hooks run after its
        # check): they were checked just above, so it does not compute the refusals again
        self._refusals_checked = True
        try:
            return cast(_IncompatibleKeys,
                        super().load_state_dict(state_dict, strict=strict, assign=assign))
        finally:
            self.__dict__.pop("_refusals_checked", None)  # the class default again

    def _refusals(self, state_dict: Mapping[str, Any], prefix: str) -> List[str]:
        """Why this layer's entries of ``state_dict`` cannot be loaded (empty: they can)."""
        own = self.state_dict()
        found = {k: state_dict[prefix + k] for k in own if prefix + k in state_dict}
        for key in ("values", "col"):
            given = found.get(key)
            if isinstance(given, Tensor) and given.dim() == 1 and given.shape[0] != self.nnz:
                return [f"size mismatch for {prefix}{key}: the checkpoint's pattern has nnz "
                        f"{given.shape[0]}, this layer's has nnz {self.nnz} (a "
                        "SparseWeightLinear loads a pattern of its own nnz only; build "
                        "SparseWeightLinear(torch.sparse_csr_tensor(crow, col, values, "
                        f"({self.out_features}, {self.in_features}))) of the saved pattern "
                        "and load into it)"]
        out = entry_errors(own, state_dict, prefix)
        for key in ("crow", "col"):
            given = found.get(key)
            if (isinstance(given, Tensor) and given.shape == own[key].shape
                    and not int_dtype(given.dtype)):
                out.append(f"{prefix}{key} (the loaded pattern) must have an integer dtype, "
                           f"got {given.dtype}")
        return out

    def __setstate__(self, state: Dict[str, Any]) -> None:
        # (torch.load(weights_only=True) allows the class) a file's pattern is checked at
        # its first use: whatever key it says the pattern was checked under is dropped
        super().__setstate__(state)  # type: ignore[no-untyped-call]
        self.__dict__["_pattern_key"] = None  # (no pattern's key: checked again)

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str,
                              local_metadata: Any, strict: bool, missing_keys: List[str],
                              unexpected_keys: List[str], error_msgs: List[str]) -> None:
        # validate before anything is copied: a refused pattern, or an entry of another
        # nnz or kind, leaves the layer as it was (also inside a parent's load); this
        # layer's own load_state_dict checked them already
        refusals = [] if self._refusals_checked else self._refusals(state_dict, prefix)
        if refusals:
            error_msgs.extend(refusals)
            return
        self._check_loaded_pattern(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def _check_loaded_pattern(self, state_dict: Mapping[str, Any], prefix: str) -> None:
        """``ValueError`` unless the pattern this layer would hold after loading
        ``state_dict`` (its ``crow``/``col``, or its own) is a valid CSR pattern.  Also run
        by :func:`nnsparse._load.check_state_dict` for a layer inside the loaded module,
        before anything of the module is copied."""
        crow = state_dict.get(prefix + "crow", self.crow)
        col = state_dict.get(prefix + "col", self.col)
        if prefix + "crow" in state_dict or prefix + "col" in state_dict:
            # a lone crow or col is checked with the layer's other half
            _check_csr(crow.to(torch.int64), col.to(torch.int64), col, self.out_features,
                       self.in_features, f"{prefix}crow/{prefix}col (the loaded pattern)")
        else:
            # the layer keeps its own pattern, which a file (torch's unpickler sets the
            # buffers) or an in-place edit may have left unchecked: checked (once, then
            # recorded) before the values are copied, so a refused load changes nothing
            self._check_pattern()

    # -- the pattern's structures ------------------------------------------------
    def _derive(self) -> None:
        """Each position's row and the transposed structure (not saved): rebuilt on load."""
        index, col = self.col.dtype, self.col.to(torch.int64)
        row = _index.rows_from_crow(self.crow, col.shape[0])
        perm = _index.stable_order(col, self.in_features)
        if self.in_features < 2 * col.shape[0]:
            # a pointer for every input column (fewer than 2 x nnz): a sparse input's
            # columns index them directly; t_cols is then empty
            cols, counts = col[:0], _index.counts_of(col, self.in_features)
        elif col.device.type == "meta":
            # no data, so the distinct columns are unknown: buffers of their largest size
            # (one per position), O(nnz) as on a real device (to_empty allocates them;
            # a loaded state derives the real ones)
            cols, counts = col, torch.ones_like(col)
        else:  # pointers over the distinct columns t_cols only: O(nnz) whatever in_features
            cols, counts = torch.unique_consecutive(col.index_select(0, perm),
                                                    return_counts=True)
        self.register_buffer("t_perm", perm.to(index), persistent=False)
        self.register_buffer("t_cols", cols.to(index), persistent=False)
        self.register_buffer("t_crow", _index.crow_from_counts(counts).to(index),
                             persistent=False)
        self.register_buffer("t_row", row.index_select(0, perm).to(index), persistent=False)
        self.__dict__["_pattern_key"] = self._pattern_key_now()

    def _every_column(self) -> bool:
        """Whether ``t_crow`` holds a pointer for every input column (else for ``t_cols``)."""
        return self.t_crow.shape[0] == self.in_features + 1

    def _pattern_key_now(self) -> Optional[Tuple[int, ...]]:
        """What identifies the checked ``crow``/``col`` (free to read); None where the
        tensors have no storage (a ``torch.func`` transform's)."""
        crow, col = self.crow, self.col
        crow_ptr, col_ptr = _index.data_ptr(crow), _index.data_ptr(col)
        if crow_ptr is None or col_ptr is None:
            return None
        return (id(crow), crow_ptr, _version(crow), id(col), col_ptr, _version(col))

    def _check_pattern(self) -> None:
        """``crow``/``col`` as last checked, else checked again (one host sync) and the
        derived structure rebuilt: buffers edited in place or replaced (a pointer past
        nnz made the kernels read and write out of bounds), or moved with the layer."""
        if torch.compiler.is_compiling():
            return
        if isinstance(self.col, Tensor) and self.col.device.type == "meta":
            return  # no data to read (and no kernel to run), as for SparseParts
        key = self._pattern_key_now()
        if key is None or key == self.__dict__.get("_pattern_key"):
            return
        for name in ("crow", "col"):
            t = getattr(self, name)
            if not isinstance(t, Tensor) or t.layout != torch.strided or t.dim() != 1 or (
                    t.dtype not in (torch.int32, torch.int64)):
                got = (f"{t.dtype} {t.layout} tensor of shape {tuple(t.shape)}"
                       if isinstance(t, Tensor) else type(t).__name__)
                raise TypeError(f"SparseWeightLinear.{name} must be a 1-D int64 or int32 "
                                f"tensor, got {got}")
        try:
            _check_csr(self.crow.to(torch.int64), self.col.to(torch.int64), self.col,
                       self.out_features, self.in_features, "SparseWeightLinear crow/col")
        except ValueError as error:
            # the likely causes: a user's edit, or nn.Module.to_empty(), which leaves every
            # buffer uninitialised (the pattern is data, not a parameter to reset)
            raise ValueError(
                f"{error}; the pattern buffers crow/col were edited, replaced, or left "
                f"uninitialised by to_empty() (reset_parameters() resets the values, not the "
                f"pattern): load a state_dict holding the pattern, or build the layer again"
            ) from None
        self._derive()

    def _transposed_structure(self) -> Tuple[Tensor, Tensor, Tensor]:
        """``(perm, pointers over all in_features columns, rows)`` of ``W.T``: for the
        gradient of a dense input, itself ``(rows, in_features)``."""
        if self._every_column():
            return self.t_perm, self.t_crow, self.t_row
        counts = self.t_crow.new_zeros(self.in_features).index_put_(
            (self.t_cols.to(torch.int64),), self.t_crow.diff())
        return self.t_perm, _index.crow_from_counts(counts).to(self.t_row.dtype), self.t_row

    @property
    def row(self) -> Tensor:
        """The output row of each position (derived from ``crow``, not held)."""
        return _index.rows_from_crow(self.crow, self.nnz)

    @property
    def nnz(self) -> int:
        return self.col.shape[0]

    @property
    def weight(self) -> Tensor:
        """``W`` as a sparse CSR tensor ``(out_features, in_features)``; its values are
        ``self.values`` (gradients flow to them)."""
        self._check_pattern()
        return _csr_with_values(self.crow, self.col, self.values,
                                (self.out_features, self.in_features))

    def reset_parameters(self) -> None:
        """``nn.Linear``'s uniform initialisation with each row's own fan-in."""
        self._check_pattern()  # (repeat_interleave trusts output_size)
        fan_in = self.crow.diff().to(self.values.dtype)
        bound = torch.where(fan_in > 0, fan_in.clamp(min=1).rsqrt(), torch.zeros_like(fan_in))
        with torch.no_grad():
            per_entry = bound.repeat_interleave(self.crow.diff().to(torch.int64),
                                                output_size=self.nnz)
            self.values.uniform_(-1, 1).mul_(per_entry)
            if self.bias is not None:
                self.bias.uniform_(-1, 1).mul_(bound)

    # -- constructors -------------------------------------------------------------
    @classmethod
    def random(cls, in_features: int, out_features: int, density: float, *, bias: bool = True,
               generator: Optional[torch.Generator] = None, seed: Optional[int] = None,
               device: Optional[Union[torch.device, str, int]] = None,
               dtype: Optional[torch.dtype] = None) -> "SparseWeightLinear":
        """A layer whose every row connects ``max(1, round(density * in_features))``
        distinct random inputs.

        Args:
            in_features, out_features (int): the weight's shape is ``(out, in)``.
            density (float): in ``(0, 1]``, the share of inputs each row connects.
            generator (torch.Generator, optional), seed (int, optional): the
                randomness of the pattern (a CPU generator; ``seed`` makes one).
                The values are drawn from the global generator, as ``nn.Linear``'s.
            bias (bool), device, dtype: as the constructor's.

        Returns:
            SparseWeightLinear: ``out_features * k`` positions, ``k`` per row.

        Raises:
            TypeError: a size, ``density`` or ``seed`` of the wrong kind, a
                ``generator`` that is not a ``torch.Generator``, the constructor's.
            ValueError: a size below 1, ``density`` outside ``(0, 1]``, both
                ``generator`` and ``seed`` given.

        Example::

            >>> layer = nnsparse.SparseWeightLinear.random(100, 20, 0.05, seed=0)
            >>> layer.nnz, layer.crow.diff().unique().tolist()
            (100, [5])
        """
        in_features = as_count("in_features", in_features, 1, must="positive")
        out_features = as_count("out_features", out_features, 1, must="positive")
        density = _check_density(density)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if seed is not None and not is_int(seed):  # (not a numpy timedelta64)
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__} {seed!r}")
        if generator is None:
            generator = torch.Generator().manual_seed(0 if seed is None else int(seed))
        elif seed is not None:
            raise ValueError("give generator or seed, not both")
        k = max(1, min(in_features, round(density * in_features)))
        block = max(1, _RANDOM_BLOCK // in_features)
        # (float32 draws whatever torch's default dtype: the same pattern for a seed)
        cols = [torch.rand(min(block, out_features - s), in_features, generator=generator,
                           dtype=torch.float32)
                .topk(k, dim=1).indices.sort(dim=1).values for s in range(0, out_features, block)]
        col = torch.cat(cols).reshape(-1)
        crow = torch.arange(0, out_features * k + 1, k)
        pattern = _index.csr_tensor(crow, col, torch.ones(col.shape[0]), (out_features, in_features))
        return cls(pattern, bias=bias, device=device, dtype=dtype)

    @classmethod
    def from_dense(cls, linear: nn.Linear, density: float) -> "SparseWeightLinear":
        """Prune a trained ``nn.Linear`` by magnitude: keep its largest ``|weight|`` entries.

        ``max(1, round(density * out * in))`` entries are kept (ties broken by
        ``topk``), with their trained values; the bias is copied.

        Args:
            linear (nn.Linear): the trained layer; the result takes its device and dtype.
            density (float): in ``(0, 1]``, the share of the weight's entries kept.

        Returns:
            SparseWeightLinear: equal to ``linear`` where the kept entries are.

        Raises:
            TypeError: ``linear`` is not an ``nn.Linear``; ``density`` not a number.
            ValueError: ``density`` outside ``(0, 1]``; a ``linear`` with no weight
                entries.

        Example::

            >>> dense = torch.nn.Linear(4, 2)
            >>> with torch.no_grad():
            ...     dense.weight.copy_(torch.tensor([[1., -5., 0., 2.], [0., 3., 0., -4.]]))
            Parameter containing:
            ...
            >>> layer = nnsparse.SparseWeightLinear.from_dense(dense, 0.5)
            >>> layer.weight.to_dense()
            tensor([[ 0., -5.,  0.,  2.],
                    [ 0.,  3.,  0., -4.]], grad_fn=<...>)
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        density = _check_density(density)
        weight = linear.weight.detach()
        out_features, in_features = weight.shape
        if weight.numel() == 0:  # (no entry to keep: topk would fail)
            raise ValueError(f"linear must have in_features and out_features >= 1, got "
                             f"Linear({in_features}, {out_features})")
        k = max(1, round(density * weight.numel()))
        keep = weight.abs().reshape(-1).topk(k).indices.sort().values
        row, col = keep // in_features, keep % in_features
        # keep is increasing: the indices are coalesced (row-major, no repeats)
        pattern = _index.coo_tensor(torch.stack([row, col]), weight.reshape(-1)[keep],
                                    (out_features, in_features), coalesced=True)
        layer = cls(pattern, bias=linear.bias is not None, device=weight.device,
                    dtype=weight.dtype)
        with torch.no_grad():
            layer.values.copy_(weight.reshape(-1)[keep])  # row-major, as the pattern's order
            if linear.bias is not None:
                assert layer.bias is not None  # made with bias=True above
                layer.bias.copy_(linear.bias)
        return layer

    # -- forward ---------------------------------------------------------------
    @compile_boundary
    def forward(self, input: Any) -> Tensor:
        _check_parameters(self, "values", _parameter(self, "values", "(nnz,)"), (self.nnz,),
                          "(nnz,)", _parameter(self, "bias", "(out_features,)"))
        self._check_pattern()
        if self.values.device != self.col.device:  # values assigned on another device
            raise ValueError(f"SparseWeightLinear.values must be on the device of the pattern "
                             f"(crow, col) {self.col.device}, got {self.values.device}; move "
                             f"the layer with layer.to(device)")
        # a strided tensor is always dense (as for every nnsparse layer); a Lua
        # (k, 2) pair vector goes through nnsparse.from_pairs first
        if isinstance(input, Tensor) and input.layout == torch.strided:
            return self._dense_forward(input)
        if not is_sparse_form(input):
            raise TypeError("input must be a dense tensor or a sparse batch, got "
                            f"{type(input).__name__}")
        return self._sparse_forward(input)

    def _check(self, dtype: torch.dtype, device: torch.device) -> None:
        if not dtype.is_floating_point:
            raise TypeError(f"input must be floating-point, got {dtype}")
        if dtype != self.values.dtype:
            raise ValueError(f"input must have the layer's dtype {self.values.dtype}, got {dtype}")
        if device != self.values.device:
            raise ValueError(f"input must be on the layer's device {self.values.device}, "
                             f"got {device}")

    def _dense_forward(self, x: Tensor) -> Tensor:
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            lua = (f"; a Lua (k, 2) pair vector goes through nnsparse.from_pairs(input, "
                   f"size={self.in_features}), a batch of them as a list"
                   if x.dim() == 2 and x.shape[1] == 2 else "")
            raise ValueError(f"input must have in_features={self.in_features} columns, got "
                             f"shape {tuple(x.shape)}{lua}")
        self._check(x.dtype, x.device)
        lead = x.shape[:-1]
        x2 = x.reshape(math.prod(lead), self.in_features)  # -1 cannot be inferred for width 0
        # y.T = W @ x.T: the pattern's rows gather x's columns (rows of x.T).
        y = self._mm_t(x2.t()).t()
        return self._finish(y).reshape(*lead, self.out_features)

    def _mm_t(self, b: Tensor) -> Tensor:
        """``W @ b`` for a dense ``b`` ``(in_features, k)``."""
        return cast(Tensor, _PatternMM.apply(  # type: ignore[no-untyped-call]
            self.values, b.contiguous(), None, self.col, self.crow, self._transposed_structure))

    def _finish(self, y: Tensor) -> Tensor:
        return y + self.bias if self.bias is not None else y

    def _sparse_forward(self, input: Any) -> Tensor:
        _check_not_narrower(input, self.in_features, "input", "in_features")
        batch = as_sparse_batch(input, name="input", width=self.in_features, pairs=False,
                                 bound="in_features")
        self._check(batch.dtype, batch.device)
        joined = self._join(batch.col, batch.rows)
        if joined is None:  # denser input: the dense path is the smaller
            dense = batch.values.new_zeros(batch.shape).index_put(
                (batch.row, batch.col), batch.values, accumulate=True)
            y = self._mm_t(dense.t()).t()
        else:
            w_id, x_id, o = joined
            key = batch.row[x_id] * self.out_features + o
            y = _SparseInputMM.apply(  # type: ignore[no-untyped-call]
                self.values, batch.values, key, w_id, x_id, batch.rows, self.out_features)
        y = self._finish(y)
        return y.squeeze(0) if batch.is_vector else y

    def _join(self, col: Tensor, rows: int) -> Optional[Tuple[Tensor, Tensor, Tensor]]:
        """Pairs (weight entry, input entry, output row) meeting on an input column.

        ``None`` when there are more than ``rows x in_features`` of them.
        """
        t_cols, t_crow = self.t_cols.to(torch.int64), self.t_crow.to(torch.int64)
        if self._every_column():
            start = t_crow[col]
            counts = t_crow[col + 1] - start
        elif t_cols.shape[0] == 0:  # an empty pattern: no pairs
            start = counts = torch.zeros_like(col)
        else:  # each input column's span in the pattern's distinct columns (0 if absent)
            at = torch.searchsorted(t_cols, col).clamp_(max=t_cols.shape[0] - 1)
            start = t_crow[at]
            counts = torch.where(t_cols[at] == col, t_crow[at + 1] - start, 0)
        total = int(counts.sum())
        if total > rows * self.in_features:
            return None
        x_id = torch.repeat_interleave(torch.arange(col.shape[0], device=col.device), counts,
                                       output_size=total)
        # position of each pair in the transposed structure: the column's start
        # plus the pair's rank among the pairs of its input entry.
        first = torch.cumsum(counts, 0) - counts
        pos = torch.arange(total, device=col.device) + (start - first)[x_id]
        return self.t_perm[pos].to(torch.int64), x_id, self.t_row[pos].to(torch.int64)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"nnz={self.nnz}, bias={_has_bias(self)}")


def _kind(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"a dense tensor of shape {tuple(x.shape)}"
    return type(x).__name__


def _after_load(module: nn.Module, incompatible: Any) -> None:
    """A loaded pattern replaces the derived structure, checked first.  A load without
    ``crow``/``col`` keeps the layer's own, checked by ``_load_from_state_dict`` before
    the copy (a file's or an in-place edit's pattern was unchecked, and deriving it here
    recorded it as checked: forward then skipped its check); it is not read again."""
    # registered by SparseWeightLinear.__init__ on itself only
    layer = cast(SparseWeightLinear, module)
    if layer.col.device.type == "meta":
        layer._derive()  # no data to check: the derived buffers' shapes only
    else:
        # a loaded (copied or assigned) pattern is not the one last checked: checked
        # again (one host sync) and derived; the layer's own, checked before the copy,
        # is left as it is
        layer._check_pattern()
