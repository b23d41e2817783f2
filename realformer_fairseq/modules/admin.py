"""ADMIN initialisation: an omega-scaled residual for Post-LN sublayers.

Liu, Liu, Gao, Chen, Han. "Understanding the Difficulty of Training Transformers".
EMNLP 2020 (arXiv 2004.08249); Liu, Duh, Liu, Gao. "Very Deep Transformers for Neural
Machine Translation" (arXiv 2008.07772).

Every Post-LN sublayer ``i`` computes ``LN(x * omega_i + f_i(x))``. ``omega`` is set
either by *profiling* one training batch, as the reference implementation
(Transformer-Clinic) does, or by admin-torch's data-free closed form.

Profiling walks the sublayers of one stack (encoder, or decoder) in execution
order with a running ratio ``r`` that starts at 1: sublayer ``i`` uses
``omega_i = r``, then ``r <- sqrt(Var[x * omega_i] + Var[f_i(x)])``. Unlike the
reference, it happens inside the first training forward of ``fairseq-train``
(no second run, no ratio file, no globals), and ``omega`` lives in the state dict.

``omega = omega_init + omega_delta``: ``omega_init`` is a buffer holding the
profiled scalar, ``omega_delta`` a per-dimension parameter that starts at zero.
The gradient and optimizer updates are those of a per-dimension ``omega``
initialised to the profiled value (as in the reference); the split keeps the
profiled value when fairseq's FP16 optimizer holds float32 master copies of the
parameters made before profiling ran. (Weight decay pulls omega towards
``omega_init`` rather than towards 0.)
"""

import contextlib
import logging
import math
from typing import Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
from fairseq.modules import LayerDropModuleList
from torch import Tensor, nn

from ..settings import INIT_TYPES

logger = logging.getLogger(__name__)


def admin_closed_form_omega(num_residual_layers: int) -> float:
    """admin-torch's data-free omega for O(log N) output change:
    ``sqrt((N + 1) / ln(N + 1) - 1)`` for N residual sublayers."""
    if num_residual_layers < 1:
        raise ValueError(f"need at least one residual layer, got {num_residual_layers}")
    n = num_residual_layers + 1
    return math.sqrt(n / math.log(n) - 1.0)


def admin_next_ratio(scaled_residual: Tensor, branch_output: Tensor) -> float:
    """One profiling step: ``sqrt(Var[x * omega] + Var[f(x)])``, each variance over
    all elements with no Bessel correction (the reference's ``np.var`` of the
    flattened tensors)."""
    return math.sqrt(
        scaled_residual.detach().float().var(unbiased=False).item()
        + branch_output.detach().float().var(unbiased=False).item()
    )


class AdminProfiler:
    """Running ratios of one profiling pass, one chain per stack."""

    def __init__(self):
        self.ratios: Dict[str, float] = {}
        self.trace: List[dict] = []

    def omega_for(self, chain: str) -> float:
        return self.ratios.setdefault(chain, 1.0)

    def update(self, chain: str, name: str, omega: float, scaled_residual, branch_output):
        self.ratios[chain] = admin_next_ratio(scaled_residual, branch_output)
        self.trace.append({"module": name, "chain": chain, "omega": omega})


class AdminResidual(nn.Module):
    """``residual * omega + x`` (ADMIN) or ``residual + x`` (``admin=False``).

    With ``admin=False`` it has no parameters and computes exactly fairseq's
    ``residual_connection``. ``admin`` is a TorchScript constant: a scripted residual
    compiles only its own branch (profiling is never scripted: ``profiler`` is None then).
    """

    __constants__ = ["admin"]

    def __init__(self, embed_dim: int, admin: bool, chain: str):
        super().__init__()
        self.admin = admin
        self.chain = chain
        self.profiler: Optional[AdminProfiler] = None
        self.profile_name = ""
        if admin:
            self.register_buffer("omega_init", torch.ones(()))
            self.omega_delta = nn.Parameter(torch.zeros(embed_dim))

    def omega(self) -> Tensor:
        return self.omega_init + self.omega_delta

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        if not self.admin:
            return residual + x
        if self.profiler is not None:
            value = self.profiler.omega_for(self.chain)
            self.omega_init.fill_(value)
            scaled = residual * self.omega()
            self.profiler.update(self.chain, self.profile_name, value, scaled, x)
            return scaled + x
        return torch.addcmul(x, residual, self.omega())

    def extra_repr(self) -> str:
        return f"admin={self.admin}, chain={self.chain}"


def admin_residuals(model: nn.Module) -> Iterator[AdminResidual]:
    for module in model.modules():
        if isinstance(module, AdminResidual) and module.admin:
            yield module


@contextlib.contextmanager
def admin_profiling(model: nn.Module) -> Iterator[AdminProfiler]:
    """Within the block, forwards of ``model`` profile ADMIN's omega in place.

    LayerDrop (``--encoder-layerdrop``/``--decoder-layerdrop``) is paused: every
    sublayer gets its omega from the one profiling pass, in the order of the full
    stack, as without LayerDrop."""
    profiler = AdminProfiler()
    residuals = []
    for name, module in model.named_modules():
        if isinstance(module, AdminResidual) and module.admin:
            module.profiler, module.profile_name = profiler, name
            residuals.append(module)
    # LayerDropModuleList drops layers only while its own ``training`` is set; its
    # layers stay in training mode (dropout on, as the profiling pass wants)
    layer_lists = [m for m in model.modules() if isinstance(m, LayerDropModuleList) and m.training]
    for layer_list in layer_lists:
        layer_list.training = False
    try:
        yield profiler
    finally:
        for module in residuals:
            module.profiler = None
        for layer_list in layer_lists:
            layer_list.training = True


def set_closed_form_omega(model: nn.Module, num_residual_layers: Dict[str, int]):
    """Fill omega_init of every ADMIN residual from admin-torch's closed form,
    with N counted per chain (``{"encoder": 2 * L_enc, "decoder": ...}``)."""
    for module in admin_residuals(model):
        module.omega_init.fill_(admin_closed_form_omega(num_residual_layers[module.chain]))


def broadcast_omega(model: nn.Module, src: int = 0):
    """Give every distributed rank rank ``src``'s profiled omega."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    residuals = list(admin_residuals(model))
    if not residuals:
        return
    flat = torch.stack([m.omega_init.detach().float() for m in residuals])
    dist.broadcast(flat, src=src)
    for module, value in zip(residuals, flat):
        module.omega_init.fill_(value.item())


class AdminProfilingMixin:
    """For models with ADMIN residuals: profile omega on the first training
    forward (dropout on, no gradient), unless the state dict says it was done.

    The model calls ``register_admin_state`` in ``__init__`` and, first in ``forward``,
    ``if not torch.jit.is_scripting(): self.profile_admin_if_needed(<forward args>)``.
    """

    admin_init_type: str = "default"
    admin_profile_out: Optional[str] = None

    def register_admin_state(
        self,
        init_type: str,
        admin_profile_out: Optional[str],
        num_residual_layers: Dict[str, int],
    ):
        """Keep ``--init-type``/``--admin-profile-out`` (explicit values, from the
        model's settings) and add the ``admin_profiled`` buffer; with
        ``admin-closed-form``, set omega now from ``num_residual_layers`` per chain
        (e.g. ``{"encoder": 2 * L}``)."""
        if init_type not in INIT_TYPES:
            raise ValueError(f"--init-type must be one of {INIT_TYPES}, got {init_type!r}")
        self.admin_init_type = init_type
        self.admin_profile_out = admin_profile_out
        self.register_buffer("admin_profiled", torch.zeros((), dtype=torch.uint8))
        if init_type == "admin-closed-form":
            set_closed_form_omega(self, num_residual_layers)
            self.admin_profiled.fill_(1)

    @torch.jit.unused
    def profile_admin_if_needed(self, *args, **kwargs):
        """At the start of the model's ``forward`` (outside TorchScript): profile on this
        batch if this is the first training forward of an ``--init-type admin`` model."""
        if self.needs_admin_profiling():
            self.admin_profile(*args, **kwargs)

    def needs_admin_profiling(self) -> bool:
        return (
            self.admin_init_type == "admin"
            and self.training
            and not bool(self.admin_profiled)
            and not getattr(self, "_admin_profiling_now", False)
        )

    def admin_profile(self, *args, **kwargs) -> Dict[str, float]:
        """Run one forward on this batch with profiling on and store omega."""
        self._admin_profiling_now = True
        try:
            with torch.no_grad(), admin_profiling(self) as profiler:
                self(*args, **kwargs)
        finally:
            self._admin_profiling_now = False
        broadcast_omega(self)
        self.admin_profiled.fill_(1)
        omegas = {
            name: float(m.omega_init)
            for name, m in self.named_modules()
            if isinstance(m, AdminResidual) and m.admin
        }
        logger.info(
            "ADMIN profiling done on the first training batch: %d sublayers, omega %s",
            len(omegas),
            ", ".join(f"{v:.3f}" for v in omegas.values()),
        )
        if self.admin_profile_out and (not dist.is_initialized() or dist.get_rank() == 0):
            from ..atomic_files import write_json_atomic

            trace = {"omega": omegas, "profiling_order": profiler.trace}
            write_json_atomic(self.admin_profile_out, trace)
        return omegas
