"""The eleventh bad-input probe (docs/bad_inputs_probe11.md): arguments each valid alone but
inconsistent with one another or with an earlier call: a criterion prepared on one device and
given an estimate on another, a complex target beside a real estimate, in-backward optimiser
hyperparameters that torch's kernels take only as numbers, the results of ``ssort`` /
``stopk`` fed back where a sparse batch is due, widths that differ from a layer's, rows of
different dtypes collated into one batch.

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result).  The 'meta' device stands in for a second device.
"""
from typing import Any, Tuple

import pytest
import torch
from torch import nn

from probe_cases import Case, run_case
from nnsparse import MaskCriterion, SDAECriterion, SDAESparseCriterion, SparseCriterion


def _x() -> torch.Tensor:
    return torch.tensor([[1., 0., 2., 0.], [0., 3., 0., 0.], [0., 0., 0., 4.]])


def _prepared(cls: type, sparse: bool) -> Any:
    """A criterion whose ``prepare_input`` ran on a CPU batch (the mask it remembers is there)."""
    crit = cls(nn.MSELoss(), hide_ratio=0.5, generator=torch.Generator().manual_seed(0))
    crit.prepare_input(_x().to_sparse() if sparse else _x())
    return crit


def _meta(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, device="meta")


# -- criteria: a mask remembered on one device, a complex target ---------------------------

CRITERION_CASES = [
    # prepared on the CPU, then an estimate elsewhere: the remembered mask's device was not
    # compared (on a GPU torch's "Expected all tensors to be on the same device" came from
    # masked_fill_ or the entry lookup; on meta the loss was computed, a meta scalar)
    Case("sdae_dense_mask_device",
         lambda: _prepared(SDAECriterion, False)(_meta(3, 4), _meta(3, 4)), ValueError,
         r"prepare_input was given a batch on cpu, the estimate is on meta; call prepare_input "
         r"on this batch, on that device"),
    Case("mask_dense_mask_device",
         lambda: _prepared(MaskCriterion, False)(_meta(3, 4), _x().to("meta")), ValueError,
         r"MaskCriterion.prepare_input was given a batch on cpu, the estimate is on meta"),
    Case("mask_sparse_mask_device",
         lambda: _prepared(MaskCriterion, True)(_meta(3, 4), _x().to_sparse().to("meta")),
         ValueError, r"MaskCriterion.prepare_input was given a batch on cpu, the estimate is "
                     r"on meta"),
    # the target's device is still named first, as before
    Case("mask_sparse_target_device_first",
         lambda: _prepared(MaskCriterion, True)(_meta(3, 4), _x().to_sparse()), ValueError,
         r"target is on cpu, estimate on meta"),
    # a complex target beside a real estimate was cast to the estimate's dtype: the imaginary
    # part dropped with torch's warning (SparseCriterion refused it already)
    Case("sdae_dense_complex_target",
         lambda: SDAECriterion(nn.MSELoss())(torch.zeros(3, 4), _x().to(torch.complex64),
                                             mask=torch.zeros(3, 4, dtype=torch.bool)),
         TypeError, r"target values must be real numbers for MSELoss, got dtype torch.complex64"),
    Case("mask_dense_complex_target",
         lambda: _prepared(MaskCriterion, False)(torch.zeros(3, 4), _x().to(torch.complex64)),
         TypeError, r"target values must be real numbers for MSELoss, got dtype torch.complex64"),
    Case("sdae_dense_real_target_of_other_dtype_works",
         lambda: SDAECriterion(nn.MSELoss(), beta=1.0)(torch.zeros(3, 4, dtype=torch.float64),
                                                       _x(), mask=torch.zeros(3, 4, dtype=torch.bool)),
         None, check=lambda loss: loss.dtype == torch.float64 and float(loss) == 30 / 12),
    Case("sparse_criterion_sparse_prepared_same_device_works",
         lambda: _prepared(SDAESparseCriterion, True)(torch.zeros(3, 4), _x().to_sparse()),
         None, check=lambda loss: bool(torch.isfinite(loss))),
]


@pytest.mark.parametrize("case", CRITERION_CASES, ids=lambda c: c.id)
def test_probe11_criteria(case: Case) -> None:
    run_case(case)
