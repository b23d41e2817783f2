"""RAdam (Liu et al., 2020, "On the Variance of the Adaptive Learning Rate and Beyond",
arXiv 1908.03265) as a fairseq optimizer, ``--optimizer radam``.

The ADMIN paper (Liu et al., 2020, arXiv 2004.08249) and RealFormer's NMT experiments
(He et al., 2020, arXiv 2012.11747) train with RAdam, betas (0.9, 0.98), as in
Transformer-Clinic. This wraps ``torch.optim.RAdam`` (which, like Transformer-Clinic's
RAdam, takes an un-rectified momentum step while the variance estimate is not yet
tractable) with a dataclass config whose flags mirror fairseq's ``adam`` optimizer:
``--adam-betas``, ``--adam-eps``, ``--weight-decay``.
"""

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
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
    lr: List[float] = II("optimization.lr")


def _betas(value) -> tuple:
    """``--adam-betas`` as fairseq's adam.py accepts it: a string "(b1, b2)" or a list."""
    if isinstance(value, str):
        betas = eval(value)  # same parsing as fairseq.optim.adam
    else:
        betas = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return tuple(float(b) for b in betas)


@register_optimizer("radam", dataclass=FairseqRAdamConfig)
class FairseqRAdam(FairseqOptimizer):
    """``torch.optim.RAdam`` with fairseq's optimizer interface."""

    def __init__(self, cfg: FairseqRAdamConfig, params):
        super().__init__(cfg)
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
