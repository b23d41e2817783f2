"""Where ``--residual-attention-impl auto`` runs the concat or the triton route: measured rules,
as data (RealFormer, He et al. 2020, arXiv 2012.11747).

A :class:`ConcatRule` names the device, torch minor version, dtypes and chains it was measured
with, and ``min_length`` / ``depth``: on keys at least ``min_length`` long, the first ``depth``
layers of a chain run fused, the rest eager. The triton route's table, :data:`TRITON_RULES`, is
empty: it is not measured on a GPU yet, so ``auto`` never builds it. An unmeasured device, torch
or dtype, and every ``--cpu`` build (which never asks CUDA), get the eager route.
docs/reference.md, "How it works", and docs/benchmarks.md have the measurements.
"""

import dataclasses
from typing import Optional, Tuple

import torch

from ...settings import ROUTES, triton_installed


@dataclasses.dataclass(frozen=True)
class ConcatRule:
    """One measured rule of ``auto`` (see the module docstring)."""

    device_name: str  # substring of torch.cuda.get_device_name()
    capability: Tuple[int, int]  # torch.cuda.get_device_capability()
    torch_version: str  # "major.minor" of the torch build measured
    dtypes: Tuple[torch.dtype, ...]
    chains: Tuple[str, ...]  # of settings.RESIDUAL_CHAINS
    min_length: int
    depth: int
    source: str


CONCAT_RULES: Tuple[ConcatRule, ...] = (
    ConcatRule(
        device_name="H200",
        capability=(9, 0),
        torch_version="2.11",
        dtypes=(torch.float16, torch.bfloat16),
        chains=("encoder", "decoder"),
        min_length=2048,
        depth=4,
        source=(
            "studies/gpu_check.py part 4, twice on one NVIDIA H200 with torch 2.11.0+cu130 "
            "(docs/benchmarks/gpu_check_h200.json; docs/benchmarks.md, 'The routes on an "
            "H200'): at 2,048 tokens the switch depth "
            "D = 4 was best in all eight chains (fp16/bf16, 6 and 12 layers, head size 64; "
            "0.68-0.88 x the all-eager time); at 512 no depth won reliably (0.93-0.97 in the "
            "first run, 0.94-1.10 for D = 4 in the second), at 128 none; lengths between 512 "
            "and 2,048 were not measured"
        ),
    ),
)


@dataclasses.dataclass(frozen=True)
class TritonRule:
    """One measured row for the triton route: ``auto`` builds the triton route for the
    ``chains`` on this device and torch, and runs it in the measured ``dtypes`` (the eager
    route in any other dtype). ``source`` names the measurement (``studies/gpu_check.py``
    part 4 and its JSON in docs/benchmarks/)."""

    device_name: str  # substring of torch.cuda.get_device_name()
    capability: Tuple[int, int]  # torch.cuda.get_device_capability()
    torch_version: str  # "major.minor" of the torch build measured
    dtypes: Tuple[torch.dtype, ...]
    chains: Tuple[str, ...]  # of settings.RESIDUAL_CHAINS
    source: str


# Not measured on a GPU: no row, so ``auto`` never builds the triton route. A row is added
# only from a gpu_check run on that device in which the triton route wins against the eager
# route and fairseq's transformer (docs/benchmarks.md, "The triton route").
TRITON_RULES: Tuple[TritonRule, ...] = ()


def torch_minor_version(version: Optional[str] = None) -> str:
    """``"2.11.0+cu130"`` -> ``"2.11"`` (default: this process's torch)."""
    version = torch.__version__ if version is None else version
    return ".".join(version.split("+")[0].split(".")[:2])


def _matching_rule(rules, chain: str, cpu: bool):
    """The first of ``rules`` for ``chain`` on the first CUDA device of this process, or None;
    None without asking CUDA anything but whether it is there for a CPU build (``cpu``)."""
    if cpu or not rules or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    capability = tuple(torch.cuda.get_device_capability(0))
    for rule in rules:
        if (
            chain in rule.chains
            and rule.device_name in name
            and rule.capability == capability
            and rule.torch_version == torch_minor_version()
        ):
            return rule
    return None


def rule_for_this_machine(chain: str, cpu: bool = False) -> Optional[ConcatRule]:
    """The concat rule of ``chain`` for the first CUDA device of this process, or None (then
    ``auto`` builds the eager route); always None for a model built for the CPU (``cpu``:
    fairseq's ``--cpu``), without touching CUDA. Read once, when a model is built."""
    return _matching_rule(CONCAT_RULES, chain, cpu)


def triton_rule_for_this_machine(chain: str, cpu: bool = False) -> Optional[TritonRule]:
    """The triton rule of ``chain`` on this machine's GPU, or None (always, until
    :data:`TRITON_RULES` has a measured row; always for a CPU build)."""
    return _matching_rule(TRITON_RULES, chain, cpu)


def built_route(impl: str, chain: str, cpu: bool = False) -> str:
    """The route a residual ``chain``'s modules are built with for ``--residual-attention-impl
    impl`` on this machine (``cpu``: the model is built for the CPU, fairseq's ``--cpu``):
    ``"eager"`` (the plain module), ``"concat"``, ``"triton"``, or ``"auto"`` (the concat
    module running its measured rule). ``auto`` builds the triton route only where a measured
    triton rule matches (none yet) and triton is installed. Every name is a key of
    ``ROUTES``; ``impl`` must be one."""
    if impl not in ROUTES:
        raise ValueError(f"--residual-attention-impl {impl}: use one of {', '.join(ROUTES)}")
    if impl != "auto":
        return impl
    if triton_rule_for_this_machine(chain, cpu) is not None and triton_installed():
        return "triton"
    if rule_for_this_machine(chain, cpu) is None:
        return "eager"
    return impl


# The triton route's concat phase: a chain's first D layers recompute their scores from the
# chain's queries and keys (no T x T tensor), layer D forms the stream and runs the stream
# kernels. D makes a chain longer than D cheapest on an H100's roofline: the concat layers
# against the stream kernels' plus forming the stream once (one product per slice, as built),
# from ``python -m studies.triton_cost --switch-depths`` (8,192-token batches, 768 wide;
# docs/benchmarks.md, "The concat phase's switch depth"); not measured on a GPU. Forming the
# stream costs about one stream-kernel layer per slice, so D = 0 in every row: the stream
# kernels run from layer 0, as before the concat phase was built. (capability, bytes per input
# element, padded head size) -> ((min_length, D), ...) by increasing min_length; shorter keys
# than the first row, a capability or width without a row: D = 0
CONCAT_PHASE_DEPTHS = {
    ((9, 0), 2, 32): ((128, 0), (512, 0), (2048, 0)),
    ((9, 0), 2, 64): ((128, 0), (512, 0), (2048, 0)),
    ((9, 0), 2, 128): ((128, 0), (512, 0), (2048, 0)),
    ((9, 0), 4, 32): ((128, 0), (512, 0), (2048, 0)),
    ((9, 0), 4, 64): ((128, 0), (512, 0), (2048, 0)),
    ((9, 0), 4, 128): ((128, 0), (512, 0), (2048, 0)),
}
# the capability whose depths the interpreter (CPU tensors) runs, so that CPU tests run the
# phase a GPU would run; its float64 takes the 16-bit rows (the tests' float64 stands in for them)
INTERPRETER_DEPTHS_OF = (9, 0)


def concat_phase_depth(
    head_dim: int, length: int, dtype: torch.dtype, capability: Optional[Tuple[int, int]]
) -> int:
    """The triton route's switch depth D for keys of ``length``, ``head_dim`` and inputs of
    ``dtype`` on a GPU of ``capability`` (None: Triton's interpreter, an H100's depths)."""
    if capability is None:
        capability = INTERPRETER_DEPTHS_OF
        width = 2 if dtype == torch.float64 else min(torch.finfo(dtype).bits // 8, 4)
    else:
        width = min(torch.finfo(dtype).bits // 8, 4)
    padded = max(32, 1 << (max(head_dim, 1) - 1).bit_length())
    depth = 0
    for min_length, rows_depth in CONCAT_PHASE_DEPTHS.get((tuple(capability), width, padded), ()):
        if length >= min_length:
            depth = rows_depth
    return depth
