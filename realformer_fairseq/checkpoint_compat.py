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
``from_pretrained`` raises it. A file torch reads that is no fairseq checkpoint (a bare state
dict, a list: no ``model`` state with a ``cfg`` / ``args`` config) is one too, caught before
fairseq's upgrade steps would fail on it with a ``KeyError``.

:func:`read_checkpoint` is the project's one reader of a checkpoint for its own tools (the
pipelines' helpers, GLUE's predictions, pre-training's evaluation): the above, and one line for
a missing file, a pickled object fairseq never writes, and a model ``--arch`` that no registry
knows (naming it and what registers it). Anything else (a ``KeyError`` in one of fairseq's
upgrade steps on a checkpoint that has a model and a config, ``MemoryError``, ...) is not the
file's fault that one line could name, and keeps its traceback.
"""

import argparse
import collections
import enum
import functools
import os
import pickle
import re
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
    if isinstance(err, (EOFError, UnicodeDecodeError)):  # a string of the pickle is no UTF-8
        return first
    if isinstance(err, RuntimeError) and text.startswith("PytorchStreamReader failed"):
        return first
    if isinstance(err, pickle.UnpicklingError):
        # the restricted unpickler on bytes that are no pickle (text, JSON, gzip): "Unsupported
        # operand N" (N: the byte it met)
        operand = re.search(r"Unsupported operand \d+", text)
        if operand:
            return operand.group(0)
        if "truncated" in text or "load key" in text:
            return first
    return None


class _NotACheckpoint(Exception):
    """Raised by the check before fairseq's upgrade steps; the loader adds the file's name."""


def not_a_checkpoint_reason(state):
    """Why what torch read is no fairseq checkpoint, or None: fairseq's ``save_state`` writes a
    dict with the ``model`` state and the config as ``cfg`` (or, before fairseq 0.10, ``args``)."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not a dict"
    if "model" in state and (state.get("cfg") is not None or state.get("args") is not None):
        return None
    keys = ", ".join(sorted(map(str, state))[:6]) + (", ..." if len(state) > 6 else "")
    return f"a dict of {keys or 'nothing'}, without the 'model' state and its 'cfg' / 'args'"


def _checked_before_upgrade(upgrade):
    @functools.wraps(upgrade)
    def _upgrade_state_dict(state):
        reason = not_a_checkpoint_reason(state)
        if reason is not None:
            raise _NotACheckpoint(reason)
        return upgrade(state)

    return _upgrade_state_dict


def install():
    """Wrap ``fairseq.checkpoint_utils.load_checkpoint_to_cpu`` (idempotent), and check what
    torch read before fairseq's ``_upgrade_state_dict`` (called by it alone)."""
    from fairseq import checkpoint_utils

    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, _PATCHED_FLAG, False):
        return
    checkpoint_utils._upgrade_state_dict = _checked_before_upgrade(
        checkpoint_utils._upgrade_state_dict
    )

    @functools.wraps(original)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            with torch.serialization.safe_globals(fairseq_checkpoint_globals()):
                return original(path, *args, **kwargs)
        except _NotACheckpoint as err:
            raise RealformerCheckpointError(f"{path}: not a fairseq checkpoint ({err})") from None
        except (RuntimeError, EOFError, pickle.UnpicklingError, UnicodeDecodeError) as err:
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


def read_checkpoint(path: str, arg_overrides: typing.Optional[dict] = None) -> dict:
    """fairseq's checkpoint at ``path`` (``load_checkpoint_to_cpu``, its config updated with
    ``arg_overrides``), for the project's own tools; see the module docstring for what is one
    line (:class:`~realformer_fairseq.errors.RealformerCheckpointError`) and what is not."""
    from fairseq import checkpoint_utils

    if not os.path.isfile(path):
        raise RealformerCheckpointError(f"{path}: missing checkpoint file")
    install()
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides)
    except pickle.UnpicklingError as err:  # what the wrapper left: a refused pickled global
        refused = re.search(r"GLOBAL ([\w.]+)", str(err))
        if refused is None:
            raise
        raise RealformerCheckpointError(
            f"{path}: not a fairseq checkpoint (it pickles {refused.group(1)}, which fairseq does "
            "not write and torch.load's safe unpickler refuses)"
        ) from None
    check_architecture(state, path)
    return state


def _get(cfg, key, default=None):
    if cfg is None:
        return default
    if isinstance(cfg, dict) or hasattr(cfg, "get"):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def check_architecture(state: dict, path: str):
    """The checkpoint's model ``--arch`` is one fairseq's registries know (after importing this
    plugin), else one line naming it and what registers it: the ``--user-dir`` the checkpoint was
    trained with (its ``cfg.common.user_dir``), if any."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    cfg = state.get("cfg")
    model_cfg = _get(cfg, "model")
    if model_cfg is None:
        raise RealformerCheckpointError(f"{path}: not a fairseq checkpoint (no model config)")
    arch = _get(model_cfg, "arch") or _get(model_cfg, "_name")
    if arch in ARCH_MODEL_REGISTRY or arch in MODEL_REGISTRY:
        return
    user_dir = _get(_get(cfg, "common"), "user_dir")
    here = os.path.dirname(os.path.abspath(__file__))
    if user_dir and os.path.basename(os.path.normpath(str(user_dir))) == os.path.basename(here):
        hint = (
            f"it was trained with the plugin at --user-dir {user_dir}; the realformer_fairseq "
            f"imported here ({here}) does not register it (another version?)"
        )
    elif user_dir:
        hint = (
            f"it was trained with --user-dir {user_dir}, which registers it: import that plugin "
            f"first (fairseq's commands: --user-dir {user_dir})"
        )
    else:
        hint = "neither fairseq nor realformer_fairseq registers it (trained without --user-dir)"
    raise RealformerCheckpointError(
        f"{path}: the checkpoint's model --arch {arch} is not registered; {hint}"
    )
