"""``realformer-average-checkpoints``: average the parameters of fairseq checkpoints.

RealFormer's NMT results (He et al., 2020, arXiv 2012.11747, following ADMIN, Liu et al.,
2020) are reported on the average of the last epoch checkpoints. fairseq's
``scripts/average_checkpoints.py`` is not part of its wheel; this command takes the
same options (``--inputs``, ``--output``, ``--num-epoch-checkpoints``,
``--num-update-checkpoints``, ``--checkpoint-upper-bound``) and adds the checks
that a long reproduction needs:

* checkpoints are read with ``torch.load(weights_only=True)`` under an allow-list
  of the types fairseq pickles (``checkpoint_compat.fairseq_checkpoint_globals``),
  so it works under torch >= 2.6 without turning the safe unpickler off;
* checkpoints of different models (architecture, RealFormer flags, parameter
  names or shapes) are refused with a one-line error;
* ``--output`` may not be one of the inputs, and it is written to a temporary
  name in the same folder and renamed, so an interrupted run leaves no partial
  file under the final name.

The output keeps everything of the newest input (config, optimizer state,
extra state) but its ``model`` entry: floating-point tensors are averaged (in
float64, then cast back to their dtype), other tensors must agree and are
copied.
"""

import argparse
import collections
import logging
import os
import re
import sys
from typing import Dict, List, Optional, Sequence

import torch

from realformer_pipelines.startup import console_entry_point

from ..atomic_files import atomic_output
from ..errors import RealformerConfigError, exit_with_one_line

logger = logging.getLogger("realformer_fairseq.average_checkpoints")

PROG = "realformer-average-checkpoints"

# model config keys that change the computation without changing parameter shapes
_STRUCTURE_KEYS = (
    "arch",
    "_name",
    "residual_attention",
    "residual_attention_mode",
    "encoder_normalize_before",
    "decoder_normalize_before",
)


class AverageError(RealformerConfigError):
    """Bad input; the message is printed as one line."""


def _checkpoint_paths(
    folder: str, n: int, pattern: str, upper_bound: Optional[int], what: str
) -> List[str]:
    """The ``n`` checkpoints of ``folder`` with the largest number captured by
    ``pattern`` (at most ``upper_bound``), oldest first."""
    if not os.path.isdir(folder):
        raise AverageError(
            f"{folder}: not a folder (with --num-{what}-checkpoints, --inputs is one folder)"
        )
    regex = re.compile(pattern)
    found = []
    for name in os.listdir(folder):
        match = regex.fullmatch(name)
        if match:
            number = int(match.group(1))
            if upper_bound is None or number <= upper_bound:
                found.append((number, os.path.join(folder, name)))
    if len(found) < n:
        raise AverageError(
            f"{folder}: asked for the last {n} {what} checkpoints but found {len(found)}"
            + (f" with number <= {upper_bound}" if upper_bound is not None else "")
        )
    found.sort()
    return [path for _, path in found[-n:]]


def resolve_inputs(args) -> List[str]:
    if args.num_epoch_checkpoints is not None and args.num_update_checkpoints is not None:
        raise AverageError("use --num-epoch-checkpoints or --num-update-checkpoints, not both")
    if args.num_epoch_checkpoints is not None or args.num_update_checkpoints is not None:
        if len(args.inputs) != 1:
            raise AverageError("with --num-*-checkpoints, --inputs must be a single folder")
        if args.num_epoch_checkpoints is not None:
            n, pattern, what = args.num_epoch_checkpoints, r"checkpoint(\d+)\.pt", "epoch"
        else:
            n, pattern, what = args.num_update_checkpoints, r"checkpoint_\d+_(\d+)\.pt", "update"
        if n < 1:
            raise AverageError(f"--num-{what}-checkpoints must be >= 1, got {n}")
        return _checkpoint_paths(args.inputs[0], n, pattern, args.checkpoint_upper_bound, what)
    if args.checkpoint_upper_bound is not None:
        raise AverageError(
            "--checkpoint-upper-bound needs --num-epoch- or --num-update-checkpoints"
        )
    for path in args.inputs:
        if os.path.isdir(path):
            raise AverageError(
                f"{path}: is a folder; pass checkpoint files or --num-epoch-checkpoints"
            )
    return list(args.inputs)


def load_checkpoint(path: str) -> dict:
    """``torch.load`` of a fairseq checkpoint with the safe unpickler and fairseq's types."""
    if not os.path.isfile(path):
        raise AverageError(f"{path}: no such checkpoint file")
    from realformer_fairseq.checkpoint_compat import fairseq_checkpoint_globals

    try:
        # torch >= 2.5 (setup.py): safe_globals exists, the restricted unpickler always runs
        with torch.serialization.safe_globals(fairseq_checkpoint_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure is bad input
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise AverageError(f"{path}: cannot be read as a fairseq checkpoint ({first_line})")
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise AverageError(f"{path}: not a fairseq checkpoint (no 'model' state dict)")
    return state


def _get(container, key):
    if container is None:
        return None
    if isinstance(container, dict) or hasattr(container, "get"):
        try:
            return container.get(key)
        except Exception:  # noqa: BLE001 - omegaconf missing values
            return None
    return getattr(container, key, None)


def model_structure(state: dict) -> Dict[str, object]:
    """The config values of ``_STRUCTURE_KEYS`` stored in a checkpoint (cfg.model or args)."""
    model_cfg = _get(_get(state, "cfg"), "model")
    if model_cfg is None:
        model_cfg = _get(state, "args")
    out = {}
    for key in _STRUCTURE_KEYS:
        value = _get(model_cfg, key)
        if value is not None:
            out[key] = value
    if "arch" not in out and "_name" in out:
        out["arch"] = out["_name"]
    out.pop("_name", None)
    return out


def check_compatible(paths: Sequence[str], states: Sequence[dict]):
    """Raise AverageError unless all checkpoints are of the same model."""
    ref_path, ref = paths[0], states[0]
    ref_struct = model_structure(ref)
    ref_shapes = {k: tuple(v.shape) for k, v in ref["model"].items() if torch.is_tensor(v)}
    for path, state in zip(paths[1:], states[1:]):
        struct = model_structure(state)
        for key in sorted(set(ref_struct) | set(struct)):
            if ref_struct.get(key) != struct.get(key):
                raise AverageError(
                    f"{path} and {ref_path} are different models: {key} "
                    f"{struct.get(key)!r} vs {ref_struct.get(key)!r}; refusing to average"
                )
        shapes = {k: tuple(v.shape) for k, v in state["model"].items() if torch.is_tensor(v)}
        missing = sorted(set(ref_shapes) - set(shapes))
        extra = sorted(set(shapes) - set(ref_shapes))
        if missing or extra:
            name = (missing or extra)[0]
            where = f"{ref_path} only" if missing else f"{path} only"
            raise AverageError(
                f"{path} and {ref_path} are different models: parameter {name} is in {where} "
                f"({len(missing)} missing, {len(extra)} extra); refusing to average"
            )
        for name, shape in shapes.items():
            if ref_shapes[name] != shape:
                raise AverageError(
                    f"{path} and {ref_path} are different models: parameter {name} has shape "
                    f"{list(shape)} vs {list(ref_shapes[name])}; refusing to average"
                )


def average_states(paths: Sequence[str], states: Sequence[dict]) -> "collections.OrderedDict":
    """Mean of the ``model`` entries; non-float tensors must be equal and are copied."""
    averaged = collections.OrderedDict()
    first = states[0]["model"]
    for name, value in first.items():
        if not torch.is_tensor(value):
            averaged[name] = value
            continue
        if value.is_floating_point():
            total = torch.zeros_like(value, dtype=torch.float64)
            for state in states:
                total += state["model"][name].to(torch.float64)
            averaged[name] = (total / len(states)).to(value.dtype)
        else:
            for path, state in zip(paths[1:], states[1:]):
                if not torch.equal(state["model"][name], value):
                    raise AverageError(
                        f"{path} and {paths[0]}: non-float tensor {name} differs; "
                        "refusing to average it"
                    )
            averaged[name] = value.clone()
    return averaged


def _same_file(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def average_checkpoints(inputs: Sequence[str], output: str) -> dict:
    """Average ``inputs`` into ``output`` (temp file + rename); returns the new state."""
    if not inputs:
        raise AverageError("no input checkpoints")
    for path in inputs:
        if _same_file(path, output):
            raise AverageError(f"--output {output} is one of the inputs; refusing to overwrite it")
    if len(set(os.path.realpath(p) for p in inputs)) != len(inputs):
        raise AverageError("the same checkpoint is given twice in --inputs")
    out_dir = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(out_dir):
        raise AverageError(f"--output {output}: folder {out_dir} does not exist")

    states = []
    for path in inputs:
        logger.info(f"loading {path}")
        states.append(load_checkpoint(path))
    check_compatible(inputs, states)
    new_state = dict(states[-1])  # the newest checkpoint's config, optimizer and extra state
    new_state["model"] = average_states(inputs, states)
    new_state["averaged_checkpoints"] = [os.path.abspath(p) for p in inputs]

    with atomic_output(output) as tmp:
        torch.save(new_state, tmp)
    logger.info(f"averaged {len(inputs)} checkpoints into {output}")
    return new_state


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Average the parameters of fairseq checkpoints of one model "
        "(options as fairseq's scripts/average_checkpoints.py).",
    )
    parser.add_argument(
        "--inputs",
        required=True,
        nargs="+",
        help="checkpoint files, or one folder with --num-epoch/update-checkpoints",
    )
    parser.add_argument("--output", required=True, metavar="FILE", help="averaged checkpoint")
    num = parser.add_mutually_exclusive_group()
    num.add_argument(
        "--num-epoch-checkpoints",
        type=int,
        metavar="N",
        help="average the last N checkpoint{EPOCH}.pt of the --inputs folder",
    )
    num.add_argument(
        "--num-update-checkpoints",
        type=int,
        metavar="N",
        help="average the last N checkpoint_{EPOCH}_{UPDATE}.pt of the --inputs folder",
    )
    parser.add_argument(
        "--checkpoint-upper-bound",
        type=int,
        metavar="K",
        help="with --num-*-checkpoints: only epochs/updates <= K",
    )
    return parser


@exit_with_one_line(PROG)
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = get_parser().parse_args(argv)
    inputs = resolve_inputs(args)
    logger.info(f"averaging {len(inputs)} checkpoints: {', '.join(inputs)}")
    average_checkpoints(inputs, args.output)
    return 0


@console_entry_point
def cli_main():
    # fairseq-style log lines (force: importing fairseq may have configured logging already)
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stderr,
        force=True,
    )
    sys.exit(main())


if __name__ == "__main__":
    cli_main()
