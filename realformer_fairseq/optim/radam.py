"""RAdam (Liu et al., 2020, "On the Variance of the Adaptive Learning Rate and Beyond",
arXiv 1908.03265) as a fairseq optimizer, ``--optimizer radam``.

The ADMIN paper (Liu et al., 2020, arXiv 2004.08249) and RealFormer's NMT experiments
(He et al., 2020, arXiv 2012.11747) train with RAdam, betas (0.9, 0.98), with
Transformer-Clinic's optimizer (github LiyuanLucasLiu/Transformer-Clinic,
``radam_fairseq/radam.py``). Its flags mirror fairseq's ``adam`` optimizer: ``--adam-betas``,
``--adam-eps``, ``--weight-decay``. Two update rules, ``--radam-variant``:

``torch`` (default): ``torch.optim.RAdam``. While the variance rectification is not tractable
(rho_t <= 5) it takes an un-rectified momentum step ``lr * m_t / (1 - beta1^t)``; afterwards
``lr * r_t * m_hat / (sqrt(v_t / (1 - beta2^t)) + eps)``; weight decay as L2 on the gradient
(or decoupled with ``--decoupled-weight-decay``).

``clinic``: Transformer-Clinic's rule, step for step. It differs from ``torch`` in three ways:

* while rho_t < 5 it does **not move** the parameters at all (its momentum step is commented
  out); with betas (0.9, 0.98) that is the first 5 updates; ``torch`` switches at rho_t > 5;
* ``eps`` is added to ``sqrt(v_t)`` before the bias correction ``sqrt(1 - beta2^t)`` is folded
  into the step size, i.e. an effective eps of ``eps / sqrt(1 - beta2^t)``;
* weight decay is decoupled, ``p -= weight_decay * lr * p``, applied on every step (also the
  ones without an update), before the Adam step.

The state is the same (``step``, ``exp_avg``, ``exp_avg_sq``), computed in float32 for fp16
parameters, so a checkpoint resumes under either rule.
"""

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf


@dataclass
class FairseqRAdamConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for RAdam optimizer"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for RAdam optimizer"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    decoupled_weight_decay: bool = field(
        default=False,
        metadata={"help": "apply weight decay as in AdamW (decoupled) instead of L2 on the grad"},
    )
    radam_variant: ChoiceEnum(["torch", "clinic"]) = field(
        default="torch",
        metadata={"help": "update rule: torch.optim.RAdam, or Transformer-Clinic's (see radam.py)"},
    )
    lr: List[float] = II("optimization.lr")


def _betas(value) -> tuple:
    """``--adam-betas`` as fairseq's adam.py accepts it: a string "(b1, b2)" or a list."""
    if isinstance(value, str):
        betas = eval(value)  # same parsing as fairseq.optim.adam
    else:
        betas = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return tuple(float(b) for b in betas)


class ClinicRAdam(torch.optim.Optimizer):
    """RAdam with Transformer-Clinic's update rule (module docstring: how it differs)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @property
    def supports_memory_efficient_fp16(self):
        return True

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            rho_inf = 2.0 / (1.0 - beta2) - 1.0
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("RAdam does not support sparse gradients")
                # float32 for fp16/bf16 parameters (as the reference), else their own dtype
                dtype = torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype
                grad = p.grad.to(dtype)
                weights = p.detach().to(dtype, copy=True)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(weights)
                    state["exp_avg_sq"] = torch.zeros_like(weights)
                state["exp_avg"] = state["exp_avg"].to(dtype)
                state["exp_avg_sq"] = state["exp_avg_sq"].to(dtype)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                state["step"] += 1
                t = state["step"]
                beta2_t = beta2**t
                rho_t = rho_inf - 2.0 * t * beta2_t / (1.0 - beta2_t)
                if group["weight_decay"] != 0:
                    weights.add_(weights, alpha=-group["weight_decay"] * group["lr"])
                if rho_t >= 5:
                    rect = (
                        (rho_t - 4)
                        * (rho_t - 2)
                        * rho_inf
                        / ((rho_inf - 4) * (rho_inf - 2) * rho_t)
                    )
                    step_size = group["lr"] * math.sqrt((1.0 - beta2_t) * rect) / (1.0 - beta1**t)
                    weights.addcdiv_(m, v.sqrt().add_(group["eps"]), value=-step_size)
                p.copy_(weights)
        return loss


@register_optimizer("radam", dataclass=FairseqRAdamConfig)
class FairseqRAdam(FairseqOptimizer):
    """RAdam with fairseq's optimizer interface: ``torch.optim.RAdam`` or, with
    ``--radam-variant clinic``, :class:`ClinicRAdam`."""

    def __init__(self, cfg: FairseqRAdamConfig, params):
        super().__init__(cfg)
        if getattr(cfg, "radam_variant", "torch") == "clinic":
            config = dict(self.optimizer_config)
            del config["decoupled_weight_decay"]  # always decoupled there
            self._optimizer = ClinicRAdam(params, **config)
        else:
            self._optimizer = torch.optim.RAdam(params, **self.optimizer_config)

    @property
    def optimizer_config(self):
        """Keyword arguments that override those stored in a checkpoint on resume
        (so that e.g. a new ``--lr`` takes effect), as in fairseq's adam.py."""
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr
        return {
            "lr": lr,
            "betas": _betas(self.cfg.adam_betas),
            "eps": self.cfg.adam_eps,
            "weight_decay": self.cfg.weight_decay,
            "decoupled_weight_decay": self.cfg.decoupled_weight_decay,
        }

    @property
    def supports_flat_params(self):
        return True
