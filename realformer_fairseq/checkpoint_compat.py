"""Loading fairseq checkpoints under torch >= 2.6.

torch 2.6 made ``torch.load(weights_only=True)`` the default. fairseq 0.12's
``checkpoint_utils.load_checkpoint_to_cpu`` calls ``torch.load`` without the
argument, and its checkpoints hold more than tensors (the training config as an
``argparse.Namespace`` or an omegaconf ``DictConfig``, meters, numpy scalars), so
``fairseq-generate``/``fairseq-train --restore-file`` fail to unpickle them.

This is the one place the plugin handles it: importing the plugin (which every
fairseq command does for ``--user-dir``) wraps ``load_checkpoint_to_cpu`` so that
it runs with an *allow-list* of the types fairseq itself writes into checkpoints
(``torch.serialization.safe_globals``). The restricted unpickler stays on: a
checkpoint carrying any other object still fails to load, as torch intends; no
environment variable is needed or set.
"""

import argparse
import collections
import enum
import functools
import typing

import numpy as np
import torch

_PATCHED_FLAG = "_realformer_safe_globals"


def fairseq_checkpoint_globals() -> list:
    """Types fairseq 0.12 pickles into its checkpoints besides tensors."""
    from fairseq import meters
    from omegaconf import DictConfig, ListConfig, base, nodes

    allowed = [
        argparse.Namespace,
        collections.OrderedDict,
        collections.defaultdict,
        dict,
        list,
        set,
        tuple,
        typing.Any,
        enum.Enum,
        DictConfig,
        ListConfig,
        base.ContainerMetadata,
        base.Metadata,
        nodes.AnyNode,
        nodes.StringNode,
        nodes.IntegerNode,
        nodes.FloatNode,
        nodes.BooleanNode,
        nodes.EnumNode,
        np.dtype,
        np.ndarray,
        np.core.multiarray.scalar,
        np.core.multiarray._reconstruct,
        np.float64,
        np.float32,
        np.int64,
        np.dtypes.Float64DType,
        np.dtypes.Float32DType,
        np.dtypes.Int64DType,
    ]
    for name in dir(meters):
        obj = getattr(meters, name)
        if isinstance(obj, type) and issubclass(obj, meters.Meter):
            allowed.append(obj)
    # the enums fairseq's dataclass configs use (ChoiceEnum subclasses)
    from fairseq.dataclass import constants

    for name in dir(constants):
        obj = getattr(constants, name)
        if isinstance(obj, type) and issubclass(obj, enum.Enum):
            allowed.append(obj)
    return allowed


def install():
    """Wrap ``fairseq.checkpoint_utils.load_checkpoint_to_cpu`` (idempotent)."""
    from fairseq import checkpoint_utils

    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, _PATCHED_FLAG, False):
        return

    @functools.wraps(original)
    def load_checkpoint_to_cpu(*args, **kwargs):
        with torch.serialization.safe_globals(fairseq_checkpoint_globals()):
            return original(*args, **kwargs)

    setattr(load_checkpoint_to_cpu, _PATCHED_FLAG, True)
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
