"""DynamicSparseTensor: build a sparse tensor entry by entry, like ``std::vector``."""
from __future__ import annotations

import math
import numbers
import operator
from array import array
from typing import (TYPE_CHECKING, Any, Dict, FrozenSet, List, Optional, Sequence, Tuple,
                    Union, cast)

import numpy as np
import torch
from torch import Tensor

from .convert import _size_from_tensor
from ._lua import LuaCount, LuaName
from ._forms import (_INT64_MAX, EXACT_INDEX, NO_INDEX, SparseBatch, _sparse_coo, as_device,
                     as_int, as_sparse_batch, dtype_got, exact_index, is_real, no_index_error,
                     real_float,
                     check_index_range, check_numel, int64_message, int_dtype, int_kind,
                     KERNEL_DTYPES,
                     refuse_meta_device)

__all__ = ["DynamicSparseTensor"]

if TYPE_CHECKING:  # (array is subscriptable at run time from Python 3.12 only)
    _IntBuffer = array[int]
    _Buffer = array[Any]
else:
    _IntBuffer = _Buffer = array

# append()'s "no value given": the Lua call append(pair) with one [index, value] row.
_NO_VALUE: Any = object()

# Appends are written into host buffers of up to this many entries, then flushed
# in one copy into the tensor storage: one torch call per chunk, not per entry.
_CHUNK = 4096
# The host buffers start this small and grow (x4) to _CHUNK: a builder of a few
# hundred entries (Lua's test: 287) neither zero-fills 64 KB nor calls torch before build.
_FIRST_CHUNK = 256
_MAX_NDIM = 64  # sparse dimensions of a builder: far beyond any use, bounded memory


def _numpy_ints(kind: type = np.integer) -> FrozenSet[type]:
    """numpy's integer scalar types (``np.int64`` and the rest), which the buffers take as
    they are: ``append``'s test of a numpy integer is a set lookup, not a call."""
    subs: List[type] = kind.__subclasses__()
    return frozenset(subs).union(*map(_numpy_ints, subs))


_NUMPY_INTS = _numpy_ints()
# The value classes append stores without a second look (a set lookup per append); any
# other value is asked _is_duration once its buffer took it.  (Not np.timedelta64, which
# numpy files under np.integer: _NUMPY_INTS holds it.)
_PLAIN_VALUES = frozenset({float, int, bool, np.float64, np.float32, np.float16}
                          | _NUMPY_INTS) - {np.timedelta64}


def _is_duration(value: Any) -> bool:
    """Whether ``value`` is a numpy duration, which a float buffer stores as its count (and
    no builder value is): a ``np.timedelta64`` (``numbers.Integral`` takes one) or a 0-d
    timedelta64 array (through the array's ``__float__``), a masked one too."""
    return isinstance(value, np.timedelta64) or (
        isinstance(value, np.ndarray) and value.dtype.kind == "m")


# Not _forms.int_of_0d (the counts' and sizes' rule) on purpose: an index also comes as a
# one-element 1-D tensor (a column of an index tensor), refused as a count; a meta tensor is
# left to the buffer's entry error; this one raises with "index must be an int".
def _one_index(i: Any) -> Any:
    """A 1-D builder's index other than a Python int, as :meth:`DynamicSparseTensor.append`
    takes it: a 0-d or one-element 1-D integer tensor (a column of an index tensor) or
    numpy array, alike, as its Python int; a bool, floating or complex one, one of another
    shape, a sparse one: ``TypeError`` "index must be an int, got ...".  Anything else
    (a numpy integer, a meta tensor, a float) as it came, for the buffer's own check."""
    if isinstance(i, Tensor):
        if i.device.type == "meta":
            return i  # the buffer refuses it: "a tensor on the meta device"
        integer = i.layout == torch.strided and int_dtype(i.dtype)
    elif isinstance(i, np.ndarray):
        integer = int_kind(i.dtype)  # (not a timedelta64 array: numpy's np.integer)
    else:
        return i
    if not integer or i.shape not in ((), (1,)):
        raise TypeError(f"index must be an int, got {type(i).__name__} {i!r}")
    return i.item()  # (a uint64 beyond int64 as a Python int: refused as for an int)


class DynamicSparseTensor:
    r"""A builder of sparse tensors that grows its storage geometrically, like ``std::vector``.

    Entries are added one at a time with :meth:`append` (amortised O(1)) or
    in bulk with :meth:`extend`, then :meth:`build` returns a torch sparse
    tensor.  This is the fast way to make a sparse tensor from a Python loop:
    repeated ``torch.cat`` copies everything at every step (O(n\ :sup:`2`)).

    The storage is a pair of tensors on ``device`` that hold ``reserve``
    entries at first and grow by ``mult_coef`` whenever full.  Single appends
    are first gathered in a small host buffer and copied into that storage
    4096 at a time, so an append costs about as much as a Python list append.

    Duplicate indices are kept: :meth:`build` returns an uncoalesced COO
    tensor in which they sum, as torch defines (a CSR result sums them).
    NaN values are stored as given.  The builder holds data, not an autograd
    graph: values are copied and no gradient flows through them.

    Args:
        reserve (int): entries the storage holds before it first grows. Default: 10.
        mult_coef (float): growth factor of the storage, ``> 1``. Default: 2.
        ndim (int): number of sparse dimensions: 1 builds a vector (the index
            of an entry is an int), 2 a ``(rows, n)`` batch (a tuple
            ``(row, col)``), and so on. Default: 1.
        dtype (torch.dtype, optional): a floating or integer dtype for the values.
            Default: ``torch.get_default_dtype()`` (float32 unless set otherwise).
        device (torch.device, optional): where the storage and the built
            tensors live. Default: torch's default device.

    Raises:
        TypeError: non-integer ``reserve`` or ``ndim``, a boolean or complex ``dtype``,
            or one torch's sparse kernels lack (uint16/32/64, float8, quantized).
        ValueError: negative ``reserve``, ``mult_coef <= 1``, ``ndim`` outside ``[1, 64]``; a
            ``device`` on which tensors hold no data (meta) or that this machine lacks.
            When the storage grows: a ``mult_coef`` so large that the grown storage
            would pass 2**63 bytes (the entries are then not added).

    Example::

        >>> builder = DynamicSparseTensor()
        >>> for i in range(0, 10, 3):
        ...     builder.append(i, float(i) / 2)
        >>> len(builder)
        4
        >>> builder.build(size=12)
        tensor(indices=tensor([[0, 3, 6, 9]]),
               values=tensor([0.0000, 1.5000, 3.0000, 4.5000]),
               size=(12,), nnz=4, layout=torch.sparse_coo)
        >>> builder.build_pairs()
        tensor([[0.0000, 0.0000],
                [3.0000, 1.5000],
                [6.0000, 3.0000],
                [9.0000, 4.5000]])
    """

    # Slots: the attribute reads of append() are its main cost after the call itself.
    __slots__ = ("_reserve", "_mult", "_ndim", "_dtype", "_device", "_float", "_ibuf", "_ibuf0",
                 "_vbuf", "_index", "_values", "_n", "_j", "_range")
    _reserve: int
    _mult: float
    _ndim: int
    _dtype: torch.dtype
    _device: torch.device
    _float: bool
    _ibuf: List[_IntBuffer]
    _ibuf0: _IntBuffer
    _vbuf: _Buffer  # typecode "d" (float dtypes) or "q" (integer dtypes)
    _index: Tensor
    _values: Tensor
    _n: int
    _j: int
    _range: Optional[Tuple[float, float]]

    # Lua's nnsparse.DynamicSparseTensor.new(reserve, multCoef) (its test's spelling)
    new = LuaName("the constructor, DynamicSparseTensor(reserve=10, mult_coef=2)")
    # Lua's builder.curSize, the number of rows appended
    curSize = LuaCount("len(builder) (or builder.len())", "append(), set() and reset()")

    def __init__(self, reserve: int = 10, mult_coef: float = 2, ndim: int = 1,
                 dtype: Optional[torch.dtype] = None,
                 device: Optional[Union[str, torch.device]] = None) -> None:
        reserve = as_int(reserve, "reserve", expected="a non-negative int")
        if dtype is None:  # as torch's factories (and Lua's default tensor type)
            dtype = torch.get_default_dtype()
        ndim = as_int(ndim, "ndim", expected=None)  # (bounded below: at most _MAX_NDIM)
        if reserve < 0:
            raise ValueError(f"reserve must be non-negative, got {reserve}")
        if not is_real(mult_coef):  # (not a bool, nor a numpy timedelta64)
            raise TypeError(f"mult_coef must be a real number, got {type(mult_coef).__name__} "
                            f"{mult_coef!r}")
        if not mult_coef > 1:  # also rejects NaN
            raise ValueError(f"mult_coef must be > 1 for the storage to grow, got {mult_coef}")
        if real_float(mult_coef) == math.inf:  # (10**400 too)
            raise ValueError(f"mult_coef must be finite, got {mult_coef}")
        if ndim < 1:
            raise ValueError(f"ndim must be at least 1, got {ndim}")
        if ndim > _MAX_NDIM:  # one index buffer per dimension: 2**64 of them filled the memory
            raise ValueError(f"ndim must be at most {_MAX_NDIM} (one index buffer is kept per "
                             f"dimension), got {ndim}")
        if reserve > _INT64_MAX // (8 * ndim):  # torch's "Storage size calculation overflowed"
            raise ValueError(f"reserve must keep the storage below 2**63 bytes ({ndim} int64 "
                             f"indices an entry), got {reserve}")
        if not isinstance(dtype, torch.dtype) or dtype == torch.bool or dtype.is_complex:
            raise TypeError(f"dtype must be a floating or integer torch.dtype, got "
                            f"{dtype_got(dtype)}")
        if dtype not in KERNEL_DTYPES:  # the built tensor could not be coalesced nor densified
            raise TypeError(f"dtype must be one of the dtypes torch's sparse kernels take "
                            f"({', '.join(str(d) for d in KERNEL_DTYPES)}), got {dtype}")
        device = as_device(device, none=True)
        refuse_meta_device(device)
        try:  # "cuda" -> "cuda:0"; a device torch names but this machine lacks is refused here
            self._device = torch.empty(0, device=device).device
        except (RuntimeError, AssertionError) as e:  # a torch built without CUDA asserts
            raise ValueError(f"device must be one this machine has, got {str(device)!r} "
                             f"({e})") from None
        self._reserve, self._mult, self._ndim, self._dtype = reserve, float(mult_coef), ndim, dtype
        self._float = dtype.is_floating_point
        self._fresh_buffers()
        self._range = _value_range(dtype)
        self._allocate(reserve)

    # -- facts -------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        """The number of sparse dimensions (index columns of an entry): 1 for a vector."""
        return self._ndim

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the values."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        """The device the storage lives on."""
        return self._device

    @property
    def capacity(self) -> int:
        """Entries the storage holds before it next grows."""
        self._flush()
        return self._values.shape[0]

    def __len__(self) -> int:
        return self._n + self._j

    def len(self) -> int:
        """The number of entries added so far (Lua nnsparse's ``len()``), duplicates included."""
        return self._n + self._j

    def __repr__(self) -> str:
        return (f"DynamicSparseTensor(len={len(self)}, ndim={self._ndim}, dtype={self._dtype}, "
                f"device={self._device})")

    def __copy__(self) -> "DynamicSparseTensor":
        """``copy.copy``: a builder with its own storage and buffers (entries added to one
        do not reach the other), as ``copy.deepcopy`` gives."""
        self._flush()  # the host buffers are then empty: the copy gets fresh ones
        new = type(self).__new__(type(self))
        for name in DynamicSparseTensor.__slots__:
            setattr(new, name, getattr(self, name))
        if hasattr(self, "__dict__"):  # a subclass's own attributes, shallow as copy.copy's
            new.__dict__.update(self.__dict__)
        new._fresh_buffers()
        new._index, new._values = self._index.clone(), self._values.clone()
        return new

    # Pickling (torch.save, DataLoader workers) keeps tensors and plain values only, so
    # torch.load(weights_only=True) reads a saved builder (nnsparse allow-lists the class).
    _BUFFERS = ("_ibuf", "_ibuf0", "_vbuf")

    def __getstate__(self) -> Dict[str, Any]:
        self._flush()  # the entries in the storage tensors; the host buffers start afresh
        state = {name: getattr(self, name) for name in DynamicSparseTensor.__slots__
                 if name not in self._BUFFERS}
        state.update(getattr(self, "__dict__", {}))  # a subclass's own attributes
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        # from a file (torch.load(weights_only=True) allows the class): ndim sets how many
        # host buffers are allocated below, so a file cannot ask for more than a builder has
        ndim = state.get("_ndim")
        if not isinstance(ndim, int) or isinstance(ndim, bool) or not 1 <= ndim <= _MAX_NDIM:
            raise ValueError(f"a saved DynamicSparseTensor must have ndim an int in "
                             f"[1, {_MAX_NDIM}], got {ndim!r}")
        for name, value in state.items():
            setattr(self, name, value)
        self._fresh_buffers()
        self._j = 0

    def _fresh_buffers(self) -> None:
        """Empty host buffers (one per dimension, one for the values) of the first chunk's
        size: for a new builder, a copy and a builder read back from a file."""
        self._ibuf = [array("q", bytes(8 * _FIRST_CHUNK)) for _ in range(self._ndim)]
        self._ibuf0 = self._ibuf[0]
        self._vbuf = array("d" if self._float else "q", bytes(8 * _FIRST_CHUNK))

    # -- adding entries -------------------------------------------------------------
    def append(self, index: Union[int, Sequence[int]], value: float = _NO_VALUE) -> None:
        """Add one entry: ``index`` an int (``ndim=1``) or a tuple of ``ndim`` ints (a 1-D
        integer tensor or numpy array of ``ndim`` entries, such as a column of an index
        tensor, passes as one; with ``ndim=1`` a numpy integer, or a 0-d or one-element
        integer tensor or numpy array, passes as the int, tensor and array alike).

        Lua's ``append(x)`` also works: one argument, an ``[index, value]``
        row (a 1-D tensor such as a row of a pair tensor, or a sequence) of
        ``ndim + 1`` numbers, its indices whole numbers (0-based).

        Raises:
            TypeError: an index that is not an int (a bool, a float, even whole, or NaN)
                or a tuple of ints, a value that is not a real number (an int
                for an integer ``dtype``); a lone argument that is not an
                ``[index, value]`` row.
            ValueError: a negative index, a tuple of the wrong length, a number
                beyond int64; an ``[index, value]`` row whose index is not a
                whole number, or beyond those its float dtype holds exactly (2**24
                for float32, 2048 for float16, 2**53 for float64).
        """
        # Checked first (about 15 ns per append): recognised from the buffers'
        # TypeError instead, append(pair) took 5.3 us, not 1.3.
        if value is _NO_VALUE:
            return self._append_row(index)
        if self._ndim != 1:
            return self._append_tuple(cast(Sequence[int], index), value)
        i: int = index  # type: ignore[assignment]  # (not cast(): a call per append)
        # (an int passes one test; a numpy integer, as iterating an index array gives, a set
        # lookup: through _one_index it took 320 ns per append, not 180)
        if i.__class__ is not int and i.__class__ not in _NUMPY_INTS:
            i = _one_index(i)
        j = self._j
        try:
            self._ibuf0[j] = i  # the array checks that i is an int
            self._vbuf[j] = value
        except IndexError:  # the buffer is full
            self._full()
            return self.append(i, value)
        except (TypeError, OverflowError, ValueError, RuntimeError):  # RuntimeError: a meta tensor
            raise self._entry_error((i,), value) from None
        # the buffers take bools as ints, and a float one a numpy duration as a float
        if i < 0 or i is True or i is False or (value.__class__ not in _PLAIN_VALUES
                                                and _is_duration(value)):
            raise self._entry_error((i,), value)
        span = self._range  # the in-range test inline: the call cost 0.2 us per append
        if span is not None and not span[0] <= self._vbuf[j] <= span[1]:
            self._check_value(self._vbuf[j])
        self._j = j + 1

    def _append_row(self, row: Any) -> None:
        """Lua's ``append(x)``: one ``[index..., value]`` row of ``ndim + 1`` numbers."""
        # Lean on purpose: this is a per-entry call (Lua's builder test times it).
        items: Sequence[Any]
        if isinstance(row, Tensor) and row.layout == torch.strided and row.dim() == 1:
            try:
                items = row.tolist()
            except (RuntimeError, NotImplementedError):  # a tensor without data (meta)
                raise self._row_error(row) from None
            exact = EXACT_INDEX.get(row.dtype)  # (torch.finfo and a call per row: 0.36 us)
            if exact is not None and items and (self._ndim > 1 or abs(items[0]) > exact):
                _check_exact_indices(items[:-1], row.dtype)
            elif exact is None and row.dtype in NO_INDEX:  # (float8_e8m0fnu: 0 read 2**-127)
                raise no_index_error(row.dtype, "the index of an [index, value] row",
                                     "build the row as float64 or int64", "it")
        elif isinstance(row, (tuple, list)):
            items = row
        else:
            raise self._row_error(row)
        if len(items) != self._ndim + 1 or items[0].__class__ is bool:  # a bool tensor's row
            raise self._row_error(row)
        if self._ndim == 1:
            i = items[0]
            if i.__class__ is float:  # a float tensor's row (_whole inline: a call per append)
                if not i.is_integer():
                    raise ValueError("the index of an [index, value] row must be a whole "
                                     f"number, got {i}")
                i = int(i)
            self.append(i, items[1])
        else:
            self.append(tuple(_whole(i) for i in items[:-1]), items[-1])

    def _row_error(self, row: Any) -> TypeError:
        what = (f"one [index, value] row of {self._ndim + 1} numbers (the Lua form) "
                "or append(index, value)")
        if isinstance(row, Tensor):
            where = " on the meta device" if row.device.type == "meta" else ""
            return TypeError(f"append needs {what}, got a tensor of shape {tuple(row.shape)}, "
                             f"dtype {row.dtype} and layout {row.layout}{where}")
        return TypeError(f"append needs {what}, got {type(row).__name__} {row!r}")

    def _check_value(self, v: float) -> None:
        """Refuse a value the builder's narrow dtype cannot hold (NaN and ±inf pass as given)."""
        lo, hi = cast(Tuple[float, float], self._range)
        if not lo <= v <= hi and not (self._float and (math.isnan(v) or math.isinf(v))):
            raise ValueError(f"value {v!r} does not fit in dtype {self._dtype}: its range is "
                             f"[{lo}, {hi}]")

    def _append_tuple(self, index: Sequence[int], value: float) -> None:
        if (isinstance(index, Tensor) and index.layout == torch.strided and index.dim() == 1
                and index.device.type != "meta" and int_dtype(index.dtype)) \
                or (isinstance(index, np.ndarray) and index.ndim == 1
                    and int_kind(index.dtype)):
            index = index.tolist()  # a 1-D integer tensor or array, as a row of an index tensor
        if not isinstance(index, (tuple, list)):
            raise TypeError(f"index must be a tuple of {self._ndim} ints, got {type(index).__name__}")
        if len(index) != self._ndim:
            raise ValueError(f"index must have {self._ndim} entries, got {len(index)}: {tuple(index)}")
        if self._j == len(self._vbuf):
            self._full()
        j = self._j
        try:
            for buf, i in zip(self._ibuf, index):
                buf[j] = i
            self._vbuf[j] = value
        except (TypeError, OverflowError, ValueError, RuntimeError):
            raise self._entry_error(index, value) from None
        # the buffers take bools as ints, and a float one a numpy duration as a float
        if min(index) < 0 or bool in map(type, index) or _is_duration(value):
            raise self._entry_error(index, value)
        if self._range is not None:
            self._check_value(self._vbuf[j])
        self._j = j + 1

    def _entry_error(self, index: Sequence[Any], value: Any) -> Exception:
        """The error an entry the host buffers refused deserves."""
        for what, t in [("index", i) for i in index] + [("value", value)]:
            if isinstance(t, Tensor) and t.device.type == "meta":
                return ValueError(f"{what} must be a number, got a tensor on the meta device")
        for i in index:
            if isinstance(i, bool):
                return TypeError(f"index must be an int, got bool {i!r}")
            try:
                i = operator.index(i)
            except TypeError:
                return TypeError(f"index must be an int, got {type(i).__name__} {i!r}")
            if i >= 2 ** 63:  # (one below int64 is refused as negative, next)
                return ValueError(int64_message("index", i, "a non-negative int"))
            if i < 0:
                shown = index[0] if len(index) == 1 else tuple(index)
                return ValueError(f"index must be non-negative, got {shown}")
        if isinstance(value, Tensor) and value.numel() != 1:
            return ValueError(f"value must be a single number, got a tensor of shape "
                              f"{tuple(value.shape)}")
        if _is_duration(value):  # (a np.timedelta64 is an Integral to numbers)
            what = "" if self._float else f" (an int for dtype {self._dtype})"
            return TypeError(f"value must be a real number{what}, got "
                             f"{type(value).__name__} {value!r}")
        if isinstance(value, (numbers.Real, Tensor)):
            if not self._float and not isinstance(value, numbers.Integral):
                return TypeError(f"value must be an int for dtype {self._dtype}, got {value!r}")
            return ValueError(f"value {value!r} does not fit in dtype {self._dtype}")
        return TypeError(f"value must be a real number, got {type(value).__name__}")

    def extend(self, indices: Any, values: Any = _NO_VALUE) -> None:
        """Add many entries at once.

        Args:
            indices: integer tensor or sequence, shape ``(m,)`` for ``ndim=1``,
                ``(m, ndim)`` otherwise, on the builder's device.  Alone (``ndim=1``),
                a ``(k, 2)`` pair tensor of ``[index, value]`` rows, as :meth:`set`
                takes and :meth:`append` takes one row of: its rows are appended.
            values: tensor or sequence ``(m,)``; cast to the builder's dtype.

        Raises:
            TypeError: non-integer indices, floating values for an integer dtype; a
                lone argument that is not a pair tensor.
            ValueError: wrong shapes, negative indices, tensors on another device.
        """
        if values is _NO_VALUE:  # extend(pairs): append's Lua row form, many rows
            if (self._ndim != 1 or not isinstance(indices, Tensor)
                    or indices.layout != torch.strided or indices.dim() != 2
                    or indices.shape[1] != 2):
                got = (f"a tensor of shape {tuple(indices.shape)} and layout {indices.layout}"
                       if isinstance(indices, Tensor) else type(indices).__name__)
                pairs = " or extend(pairs), a (k, 2) pair tensor" if self._ndim == 1 else ""
                raise TypeError(f"extend needs extend(indices, values){pairs}, got one "
                                f"argument, {got}")
            self._check_device(indices, "pairs")
            batch = as_sparse_batch(indices, name="pairs")
            index, vals = self._checked(batch.col, batch.values)
        else:
            index, vals = self._checked(indices, values)
        self._write(index, vals)

    def _checked(self, indices: Any, values: Any) -> Tuple[Tensor, Tensor]:
        """``(index (m, ndim), values (m,))`` checked for :meth:`extend`; nothing changed."""
        index = _unsigned_as_int64(self._as_tensor(indices, "indices"), "indices")
        vals = self._as_tensor(values, "values")
        given = vals.dtype
        vals = _unsigned_as_int64(vals, "values")
        if not int_dtype(index.dtype):
            if index.numel():
                raise TypeError(f"indices must be integers, got dtype {index.dtype}")
            index = index.to(torch.int64)
        shape = "(m,)" if self._ndim == 1 else f"(m, {self._ndim})"
        if self._ndim == 1 and index.dim() == 1:
            index = index.unsqueeze(1)
        elif index.dim() == 1 and index.numel() == 0:  # an empty list
            index = index.reshape(0, self._ndim)
        if index.dim() != 2 or index.shape[1] != self._ndim:
            raise ValueError(f"indices must have shape {shape}, got {tuple(index.shape)}")
        if vals.shape != (index.shape[0],):
            raise ValueError(f"values must have shape ({index.shape[0]},) like indices, "
                             f"got {tuple(vals.shape)}")
        if vals.dtype == torch.bool or vals.is_complex() or (
                vals.is_floating_point() and not self._float and vals.numel()):
            raise TypeError(f"values must be real numbers fitting dtype {self._dtype}, "
                            f"got dtype {vals.dtype}")
        check_index_range(index, None, "indices")
        self._check_cast(vals, given)
        return index, vals

    def _check_cast(self, vals: Tensor, given: torch.dtype) -> None:
        """Refuse values that a cast to the builder's dtype would change (one host sync)."""
        if self._range is None or vals.dtype == self._dtype or vals.numel() == 0:
            return
        lo, hi = self._range
        finite = vals[torch.isfinite(vals)] if vals.is_floating_point() else vals
        if finite.numel() == 0:
            return
        vmin, vmax = torch.stack([finite.min(), finite.max()]).tolist()
        if vmin < lo or vmax > hi:
            bad = vmax if vmax > hi else vmin
            raise ValueError(f"values must fit in dtype {self._dtype}, whose range is "
                             f"[{lo}, {hi}], got {bad} (dtype {given})")

    def _write(self, index: Tensor, vals: Tensor) -> None:
        self._flush()
        m, n = index.shape[0], self._n
        self._grow(n + m)
        with torch.no_grad():
            self._index[:, n:n + m].copy_(index.T)
            self._values[n:n + m].copy_(vals)
        self._n = n + m

    def set(self, pairs: Tensor) -> None:
        """Replace the content with a ``(k, 2)`` pair tensor of ``[index, value]`` rows (``ndim=1``).

        Raises:
            TypeError: ``pairs`` is not a strided tensor.
            ValueError: ``ndim`` is not 1, ``pairs`` is not ``(k, 2)``, bad
                indices, or ``pairs`` is on another device.
        """
        if self._ndim != 1:
            raise ValueError(f"set(pairs) builds vectors (ndim=1), this builder has ndim={self._ndim}")
        if not isinstance(pairs, Tensor) or pairs.layout != torch.strided:
            got = f"layout {pairs.layout}" if isinstance(pairs, Tensor) else type(pairs).__name__
            raise TypeError(f"pairs must be a (k, 2) pair tensor, got {got}")
        self._check_device(pairs, "pairs")
        batch = as_sparse_batch(pairs, name="pairs")
        index, vals = self._checked(batch.col, batch.values)  # before anything changes
        self._allocate(max(self._reserve, batch.nnz))
        self._write(index, vals)

    def reset(self) -> None:
        """Remove every entry; the storage goes back to ``reserve`` entries."""
        self._allocate(self._reserve)

    # -- results ----------------------------------------------------------------------
    def build(self, size: Optional[Union[int, Sequence[int]]] = None,
              layout: torch.layout = torch.sparse_coo) -> Tensor:
        """The entries added so far as a torch sparse tensor (a copy: the builder stays usable).

        Lua's ``build()`` returned the ``(k, 2)`` pair tensor: that is :meth:`build_pairs`.

        Args:
            size (int or tuple, optional): the tensor's shape, ``ndim`` ints
                (an int is allowed for ``ndim=1``; a 0-D or 1-D integer tensor, or one of
                whole floats, as :func:`nnsparse.densify` takes it); by default the largest index
                + 1 along each dimension.
            layout (torch.layout): ``torch.sparse_coo`` (default), or
                ``torch.sparse_csr`` when ``ndim=2``.

        Returns:
            An uncoalesced sparse COO tensor (duplicates sum), or a CSR tensor
            (duplicates summed), with the builder's dtype and device.

        Raises:
            TypeError: ``layout`` is neither of the two.
            ValueError: ``size`` smaller than the data or of the wrong length,
                CSR asked for ``ndim != 2``.
        """
        if layout not in (torch.sparse_coo, torch.sparse_csr):
            raise TypeError(f"layout must be torch.sparse_coo or torch.sparse_csr, got {layout}")
        if layout == torch.sparse_csr and self._ndim != 2:
            raise ValueError(f"layout torch.sparse_csr needs ndim=2, this builder has ndim={self._ndim}")
        index, values = self._entries()
        size = self._size(size, index)
        if layout == torch.sparse_csr:
            return SparseBatch(index[0], index[1], values, (size[0], size[1]), "coo").to_csr()
        return _sparse_coo(index, values, size, coalesced=False)

    def build_pairs(self) -> Tensor:
        """The entries as a ``(k, 2)`` pair tensor ``[index, value]`` (``ndim=1``), in order.

        Raises:
            ValueError: ``ndim`` is not 1, or a dtype that cannot hold the
                largest index exactly (int8 holds up to 127, float32 up to
                2**24, float64 up to 2**53).
        """
        if self._ndim != 1:
            raise ValueError(f"build_pairs needs ndim=1, this builder has ndim={self._ndim}")
        if self._n == 0 and self._j:  # every entry still in the host buffers
            return self._pairs_from_buffers()
        index, values = self._entries()
        if index.numel():
            _check_pair_index(int(index.max()), self._dtype)
        return torch.stack([index[0].to(self._dtype), values], dim=1)

    def _pairs_from_buffers(self) -> Tensor:
        """:meth:`build_pairs` of up to ``_CHUNK`` appended entries: the pairs interleaved
        on the host, then one torch copy (the storage path takes about ten torch calls,
        0.5 ms on their first use in a process, as long as the 287 appends of Lua's test)."""
        j = self._j
        index = self._ibuf0[:j]
        _check_pair_index(max(index), self._dtype)
        code = self._vbuf.typecode  # "d" (float dtypes) or "q" (integer dtypes)
        flat: _Buffer = array(code, bytes(16 * j))
        flat[0::2] = index if code == "q" else array("d", index)
        flat[1::2] = self._vbuf[:j]
        host = torch.frombuffer(flat, dtype=torch.float64 if self._float else torch.int64)
        return host.view(j, 2).to(self._device, self._dtype, copy=True)

    # -- storage ------------------------------------------------------------------------
    def _allocate(self, capacity: int) -> None:
        self._index = torch.empty(self._ndim, capacity, dtype=torch.int64, device=self._device)
        self._values = torch.empty(capacity, dtype=self._dtype, device=self._device)
        self._n = 0  # entries in the storage
        self._j = 0  # entries in the host buffers, not yet in the storage

    def _grow(self, needed: int) -> None:
        """Multiply the capacity by ``mult_coef`` until ``needed`` entries fit."""
        capacity = self._values.shape[0]
        if needed <= capacity:
            return
        old, limit = capacity, _INT64_MAX // (8 * self._ndim)
        while capacity < needed:
            grown = capacity * self._mult  # a float: inf past 1.8e308 (mult_coef=1e308, reserve 2)
            if grown > limit:  # a huge mult_coef: torch's "Overflow when unpacking long long"
                # (with its C++ trace), "Storage size ... overflowed", or math.ceil's
                # "cannot convert float infinity to integer"
                to = f"{grown:.3g}" if math.isfinite(grown) else "more than 1.8e+308"
                raise ValueError(f"mult_coef must keep the storage below 2**63 bytes "
                                 f"({self._ndim} int64 indices an entry), got {self._mult:g}: "
                                 f"it would grow the storage from {old} to {to} entries to "
                                 f"hold {needed}; nothing was added")
            capacity = max(capacity + 1, math.ceil(grown))
        index = self._index.new_empty(self._ndim, capacity)
        values = self._values.new_empty(capacity)
        index[:, :self._n] = self._index[:, :self._n]
        values[:self._n] = self._values[:self._n]
        self._index, self._values = index, values

    def _full(self) -> None:
        """Make room in full host buffers: grow them up to ``_CHUNK`` entries, then flush."""
        size = len(self._vbuf)
        if size >= _CHUNK:
            return self._flush()
        more = min(3 * size, _CHUNK - size)
        for buf in (*self._ibuf, self._vbuf):
            buf.frombytes(bytes(8 * more))

    def _flush(self) -> None:
        """Copy the host buffers into the storage."""
        j, n = self._j, self._n
        if j == 0:
            return
        self._grow(n + j)
        for d, buf in enumerate(self._ibuf):
            self._index[d, n:n + j].copy_(torch.frombuffer(buf, dtype=torch.int64, count=j))
        vdtype = torch.float64 if self._float else torch.int64
        self._values[n:n + j].copy_(torch.frombuffer(self._vbuf, dtype=vdtype, count=j))
        self._n, self._j = n + j, 0

    def _entries(self) -> Tuple[Tensor, Tensor]:
        self._flush()
        return self._index[:, :self._n].clone(), self._values[:self._n].clone()

    def _size(self, size: Optional[Union[int, Sequence[int]]], index: Tensor) -> Tuple[int, ...]:
        needed = tuple(check_index_range(i, None, "indices") for i in index)
        if size is None:
            return check_numel(needed, "size", f"{needed} (the largest indices + 1: no size was "
                                               f"given)")
        size = _size_from_tensor(size)  # a size tensor as densify's (Lua's torch.Tensor{2, 8})
        if isinstance(size, numbers.Integral) and self._ndim == 1:
            size = (cast(int, size),)  # a bool is refused by as_int below
        if not isinstance(size, (tuple, list, torch.Size)):
            raise TypeError(f"size must be an int or a tuple of {self._ndim} ints, got "
                            f"{type(size).__name__} {size!r}")
        if len(size) != self._ndim:
            raise ValueError(f"size must be {self._ndim} ints, got {size!r}")
        sizes = tuple(as_int(s, "size") for s in cast(Sequence[int], size))
        if any(s < need for s, need in zip(sizes, needed)):
            raise ValueError(f"size must be at least {needed} to hold the entries, got {sizes}")
        return check_numel(sizes, "size")

    def _as_tensor(self, x: Any, name: str) -> Tensor:
        if isinstance(x, Tensor):
            if x.layout != torch.strided:
                raise TypeError(f"{name} must be a dense tensor or a sequence, got layout {x.layout}")
            self._check_device(x, name)
            return x.detach()
        if isinstance(x, (str, bytes)):
            raise TypeError(f"{name} must be a tensor or a sequence of numbers, "
                            f"got {type(x).__name__}")
        try:
            return torch.as_tensor(x, device=self._device)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{name} must be a tensor or a sequence of numbers, got "
                            f"{type(x).__name__} ({e})") from None

    def _check_device(self, x: Tensor, name: str) -> None:
        if x.device != self._device:
            raise ValueError(f"{name} must be on the builder's device {self._device}, got {x.device}")


def _value_range(dtype: torch.dtype) -> Optional[Tuple[float, float]]:
    """The range of a dtype narrower than the host buffers (float64 / int64), else None."""
    if dtype in (torch.float64, torch.int64):
        return None
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return (info.min, info.max)


def _check_exact_indices(indices: Sequence[Any], dtype: torch.dtype) -> None:
    """The indices of a float row (Lua's ``[index, value]``) beyond the whole numbers its
    dtype holds exactly: the index the caller meant may already have been rounded to a
    neighbour (``from_pairs`` refuses them too).  ±inf is left to the whole-number check."""
    exact = EXACT_INDEX[dtype]
    for i in indices:
        if isinstance(i, float) and exact < abs(i) < math.inf:
            fix = ("build the row as float64 or int64" if exact < 2.0 ** 53 else
                   "give the index as an int, append(index, value)")  # (float64's own limit)
            raise ValueError(f"the index of an [index, value] row stored as {dtype} is exact "
                             f"only up to {int(exact)}, got {i:g}; {fix}")


def _check_pair_index(top: int, dtype: torch.dtype) -> None:
    """Refuse an index ``top`` that the pair tensor's dtype cannot hold exactly."""
    if dtype.is_floating_point:
        exact = int(exact_index(dtype))
        if top > exact:
            bits = exact.bit_length() - 1
            wider = ("dtype torch.float64" if top <= 2 ** 53 else
                     "an integer dtype (torch.int64)")
            raise ValueError(f"index {top} exceeds 2**{bits}, beyond which {dtype} does not "
                             f"hold every whole number, so it cannot be stored exactly as "
                             f"{dtype}; use {wider}, or build() for a sparse tensor with "
                             "int64 indices")
    elif top > torch.iinfo(dtype).max:
        raise ValueError(f"index {top} does not fit in dtype {dtype} (largest "
                         f"{torch.iinfo(dtype).max}); use dtype torch.int64, or build() for "
                         "a sparse tensor with int64 indices")


def _unsigned_as_int64(t: Tensor, name: str) -> Tensor:
    """``uint16/32/64`` as int64 (torch has no min/max for them); other dtypes unchanged.

    Raises ``ValueError`` for a uint64 entry beyond int64 (it wraps to a negative)."""
    if t.dtype not in (torch.uint16, torch.uint32, torch.uint64):
        return t
    wide = t.to(torch.int64)
    if t.dtype == torch.uint64 and wide.numel() and bool((wide < 0).any()):
        raise ValueError(int64_message(name, 2 ** 63, "ints", got="a uint64 entry >= 2**63"))
    return wide


def _whole(i: Any) -> Any:
    """A pair tensor's index (stored in the values' dtype) as an int; other kinds unchanged."""
    if i.__class__ is float:
        if not i.is_integer():
            raise ValueError(f"the index of an [index, value] row must be a whole number, got {i}")
        return int(i)
    return i
