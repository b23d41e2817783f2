"""Loading fairseq checkpoints under torch >= 2.6.

torch 2.6 made ``torch.load(weights_only=True)`` the default. fairseq 0.12's
``checkpoint_utils.load_checkpoint_to_cpu`` calls ``torch.load`` without the
argument, and its checkpoints hold more than tensors (the training config as an
``argparse.Namespace`` or an omegaconf ``DictConfig``, meters, numpy scalars), so
``fairseq-generate``/``fairseq-train --restore-file`` fail to unpickle them.
A checkpoint also names numpy's pickling functions by module (``numpy.core.multiarray`` when
numpy 1.x wrote it, ``numpy._core.multiarray`` under numpy 2): the allow-list names both, so a
checkpoint written on a numpy 1.26 CPU box loads on a numpy 2 GPU box and back.

This is the one place the plugin handles it: importing the plugin (which every
fairseq command does for ``--user-dir``) wraps ``load_checkpoint_to_cpu`` so that
it runs with an *allow-list* of the types fairseq itself writes into checkpoints
(``torch.serialization.safe_globals``). The restricted unpickler stays on: a
checkpoint carrying any other object still fails to load, as torch intends; no
environment variable is needed or set.

The same wrapper turns the error torch gives for a truncated or corrupt file (a
``RuntimeError`` of its zip reader, ``EOFError`` or a truncated pickle) into a
:class:`~realformer_fairseq.errors.RealformerCheckpointError` naming the file and its size, so
that ``fairseq-generate``, ``fairseq-interactive``, ``fairseq-train`` resuming from
``checkpoint_last.pt`` and ``realformer-attention-stats`` stop with one line instead of a
traceback (:func:`~realformer_fairseq.errors.one_line_under_fairseq_commands`), and the hub's
``from_pretrained`` raises it.
"""

import argparse
import collections
import enum
import functools
import os
import pickle
import typing

import numpy as np
import torch

from .errors import RealformerCheckpointError, one_line_under_fairseq_commands

_PATCHED_FLAG = "_realformer_safe_globals"


# the module numpy's pickles name for its pickling functions: numpy 1.x writes ``numpy.core``,
# numpy 2 ``numpy._core`` (numpy 1.26 can resolve both, numpy 2 warns on the old one)
NUMPY_CORE_SPELLINGS = ("numpy.core", "numpy._core")


def numpy_pickle_functions() -> list:
    """The running numpy's functions that rebuild a numpy scalar (``multiarray.scalar``) and an
    array (``multiarray._reconstruct``), allow-listed under the names both numpy 1.x and numpy 2
    write into a pickle: a checkpoint written under either numpy loads under the other.
    (torch's allow-list matches a pickled global by its name; each function is taken from a
    value's ``__reduce__``, so no deprecated ``numpy.core`` module is touched.)"""
    scalar = np.float64(0.0).__reduce__()[0]
    reconstruct = np.zeros(1).__reduce__()[0]
    return [
        (function, f"{core}.multiarray.{name}")
        for function, name in ((scalar, "scalar"), (reconstruct, "_reconstruct"))
        for core in NUMPY_CORE_SPELLINGS
    ]


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
        *numpy_pickle_functions(),
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


def unreadable_file_reason(err: BaseException):
    """The first sentence of torch's error when ``err`` says the file itself is unreadable
    (truncated, not a checkpoint), else ``None`` (e.g. the refusal of a pickled global)."""
    text = str(err).strip()
    first = text.split(". ")[0].splitlines()[0] if text else type(err).__name__
    if isinstance(err, EOFError):
        return first
    if isinstance(err, RuntimeError) and text.startswith("PytorchStreamReader failed"):
        return first
    if isinstance(err, pickle.UnpicklingError) and ("truncated" in text or "load key" in text):
        return first
    return None


def install():
    """Wrap ``fairseq.checkpoint_utils.load_checkpoint_to_cpu`` (idempotent)."""
    from fairseq import checkpoint_utils

    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, _PATCHED_FLAG, False):
        return

    @functools.wraps(original)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            with torch.serialization.safe_globals(fairseq_checkpoint_globals()):
                return original(path, *args, **kwargs)
        except (RuntimeError, EOFError, pickle.UnpicklingError) as err:
            reason = unreadable_file_reason(err)
            if reason is None:
                raise
            size = os.path.getsize(path) if os.path.isfile(path) else 0
            raise RealformerCheckpointError(
                f"{path}: truncated or corrupt checkpoint ({size} bytes; torch.load: {reason}); "
                "copy or save it again, or use another checkpoint"
            ) from err

    load_checkpoint_to_cpu = one_line_under_fairseq_commands(load_checkpoint_to_cpu)
    setattr(load_checkpoint_to_cpu, _PATCHED_FLAG, True)
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
