"""The layers: sparse input (:class:`SparseLinearBatch`), sparse output
(:class:`SparseOutputLinear`), a fixed-pattern sparse weight
(:class:`SparseWeightLinear`), the dense/sparse switches (:class:`Densify`,
:class:`Sparsify`), row normalisation (:class:`Normalize`), a container that
hands the pattern on (:class:`PatternSequential`) and batched inference
(:class:`Batchifier`)."""
__all__: list[str] = []
from .sparse_output import SparseOutputLinear, sampled_linear  # noqa: E402
__all__ += ["SparseOutputLinear", "sampled_linear"]
from .linear import SparseLinearBatch, sparse_linear  # noqa: E402
__all__ += ["SparseLinearBatch", "sparse_linear"]
from .convert import Densify, Sparsify  # noqa: E402
from .batchifier import Batchifier  # noqa: E402
__all__ += ["Densify", "Sparsify", "Batchifier"]
from .sequential import PatternSequential  # noqa: E402
__all__ += ["PatternSequential"]
from .sparse_weight import SparseWeightLinear  # noqa: E402
__all__ += ["SparseWeightLinear"]
from .normalization import Normalize  # noqa: E402
__all__ += ["Normalize"]
