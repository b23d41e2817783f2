"""The routes of residual attention (RealFormer, He et al. 2020, arXiv 2012.11747): how a
chain's score stream is computed, never what. One module per route; :data:`ROUTES` names them.

docs/reference.md, "Adding a route", says how a route joins.
"""

from ...settings import ROUTES
from .concat import ConcatRealformerMultiheadAttention
from .eager import RealformerMultiheadAttention
from .triton_route import TritonRealformerMultiheadAttention

# --residual-attention-impl NAME -> the route class built for it (``auto``: the concat route
# running its measured rule, or the eager or triton route where rules.built_route says so). The
# one list of routes: the flag, rules.built_route, the layer builder and the build checks read it.
ROUTES.update(
    eager=RealformerMultiheadAttention,
    concat=ConcatRealformerMultiheadAttention,
    triton=TritonRealformerMultiheadAttention,
    auto=ConcatRealformerMultiheadAttention,  # with its measured rule
)

__all__ = [
    "ROUTES",
    "ConcatRealformerMultiheadAttention",
    "RealformerMultiheadAttention",
    "TritonRealformerMultiheadAttention",
]
