"""``realformer-attention-stats``: per-layer, per-head attention entropy and the
Jensen-Shannon divergence between the same head in adjacent layers.

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention"
(arXiv 2012.11747), section 4.3 (figures 4 and 5): RealFormer's attention is
sparser in the upper layers (lower entropy) and changes less from layer to layer
(lower JS divergence between head h of layer l and head h of layer l-1).

For every non-pad query token ``t`` of every input line, layer ``l`` and head ``h``:

* entropy ``H = -sum_k p_k ln p_k`` over the non-pad keys ``k`` (nats);
* ``JS(P_l, P_{l-1}) = KL(P_l || M) / 2 + KL(P_{l-1} || M) / 2`` with
  ``M = (P_l + P_{l-1}) / 2`` (nats, at most ln 2), for ``l >= 1``.

Works for encoder-only checkpoints (``realformer_roberta``, any fairseq RoBERTa)
and encoder-decoder ones (``realformer_transformer``, fairseq's transformer):
the source lines go into the encoder (chain ``encoder``); with ``--target``, the
parallel target lines are teacher-forced through the decoder (chains ``decoder``,
self-attention, and ``cross``, encoder-decoder attention).

Writes ``attention_stats.json`` (summary per layer and head), ``attention_stats.csv``
(one row per chain, layer and head) and PNG plots per chain (``attention_plots``: violin
plots of the per-token values by layer and layer x head heatmaps of their means; they need
matplotlib, the ``plots`` extra; ``--no-plots`` writes JSON and CSV only).

Why this lives in the plugin and not in ``studies/``: it is a user-facing console command
(``realformer-attention-stats``) that reads any checkpoint of the plugin's or fairseq's
models and needs only the plugin's own dependencies (numpy, torch, fairseq); the studies call
it as a subprocess. Only its figures need the extra, and the plugin never imports matplotlib.
"""

import argparse
import contextlib
import csv
import logging
import math
import os
import sys
from collections import OrderedDict
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from realformer_pipelines.startup import console_entry_point

from ..atomic_files import atomic_output, write_json_atomic
from ..errors import RealformerConfigError, exit_with_one_line
from . import attention_plots

logger = logging.getLogger("realformer_fairseq.cli.attention_stats")

PROG = "realformer-attention-stats"
CHAINS = ("encoder", "decoder", "cross")
# the softmax never gives exactly 0 to an unmasked key; this only guards log(0)
_TINY = 1e-30


class AttentionStatsError(RealformerConfigError):
    """Bad input for the command; the message names the file and the problem."""


# ---------------------------------------------------------------------------
# statistics (numpy, float64)


def attention_entropy(probs: np.ndarray) -> np.ndarray:
    """Entropy (nats) over the last axis; zero-probability keys add nothing."""
    probs = np.asarray(probs, dtype=np.float64)
    return -(probs * np.log(np.maximum(probs, _TINY))).sum(axis=-1)


def js_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence (nats, in [0, ln 2]) over the last axis."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    m = 0.5 * (p + q)
    log_m = np.log(np.maximum(m, _TINY))
    kl_pm = (p * (np.log(np.maximum(p, _TINY)) - log_m)).sum(axis=-1)
    kl_qm = (q * (np.log(np.maximum(q, _TINY)) - log_m)).sum(axis=-1)
    return np.maximum(0.5 * (kl_pm + kl_qm), 0.0)


class ChainStats:
    """Per-token entropies and JS divergences of one attention chain, kept per
    (layer, head) as float32 arrays."""

    def __init__(self, name: str, num_layers: int, num_heads: int):
        self.name = name
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.entropy: List[List[np.ndarray]] = [[] for _ in range(num_layers)]
        self.js: List[List[np.ndarray]] = [[] for _ in range(num_layers)]
        self.num_queries = 0

    def add_batch(self, weights: Sequence[torch.Tensor], query_mask, key_mask):
        """Args:
        weights: per layer, (heads, bsz, tgt_len, src_len) attention probabilities
        query_mask: (bsz, tgt_len) bool, True for real (non-pad) queries
        key_mask: (bsz, src_len) bool, True for real (non-pad) keys
        """
        if len(weights) != self.num_layers:
            raise RuntimeError(
                f"chain {self.name}: captured {len(weights)} layers, expected {self.num_layers}"
            )
        qmask = query_mask.cpu().numpy().astype(bool)  # (bsz, tgt_len)
        kmask = key_mask.cpu().numpy().astype(bool)  # (bsz, src_len)
        prev = None
        for layer, w in enumerate(weights):
            if w.dim() != 4 or w.size(0) != self.num_heads:
                raise RuntimeError(
                    f"chain {self.name} layer {layer}: expected per-head weights "
                    f"({self.num_heads}, bsz, tgt, src), got {tuple(w.shape)}"
                )
            p = w.detach().double().cpu().numpy()  # (heads, bsz, tgt_len, src_len)
            p = p * kmask[None, :, None, :]  # over non-pad keys only
            p = p[:, qmask]  # (heads, n_queries, src_len)
            self.entropy[layer].append(attention_entropy(p).astype(np.float32))
            if prev is not None:
                self.js[layer].append(js_divergence(p, prev).astype(np.float32))
            prev = p
        self.num_queries += int(qmask.sum())

    def values(self, metric: str, layer: int) -> np.ndarray:
        """(heads, n) per-token values of ``metric`` ('entropy' or 'js')."""
        chunks = getattr(self, metric)[layer]
        if not chunks:
            return np.zeros((self.num_heads, 0), dtype=np.float32)
        return np.concatenate(chunks, axis=1)

    def summary(self) -> dict:
        """Means, medians and standard deviations per layer and head (JSON-able;
        layer 0 has no JS divergence: null)."""

        def stats(metric):
            out = {"mean": [], "median": [], "std": []}
            layer_out = {"mean": [], "median": [], "std": []}
            for layer in range(self.num_layers):
                vals = self.values(metric, layer)
                if vals.shape[1] == 0:
                    for d in (out, layer_out):
                        for key in d:
                            d[key].append(None)
                    continue
                v64 = vals.astype(np.float64)
                out["mean"].append(v64.mean(axis=1).tolist())
                out["median"].append(np.median(v64, axis=1).tolist())
                out["std"].append(v64.std(axis=1).tolist())
                layer_out["mean"].append(float(v64.mean()))
                layer_out["median"].append(float(np.median(v64)))
                layer_out["std"].append(float(v64.std()))
            return {"per_head": out, "per_layer": layer_out}

        return {
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_queries": self.num_queries,
            "entropy": stats("entropy"),
            "js_divergence": stats("js"),
        }


# ---------------------------------------------------------------------------
# capturing per-head attention probabilities


def attention_chains(model) -> "OrderedDict[str, List[torch.nn.Module]]":
    """The attention modules of each chain, in layer order."""
    from fairseq.models import FairseqEncoderDecoderModel

    chains: "OrderedDict[str, List[torch.nn.Module]]" = OrderedDict()
    if isinstance(model, FairseqEncoderDecoderModel):
        chains["encoder"] = [layer.self_attn for layer in model.encoder.layers]
        chains["decoder"] = [layer.self_attn for layer in model.decoder.layers]
        cross = [getattr(layer, "encoder_attn", None) for layer in model.decoder.layers]
        if all(m is not None for m in cross):
            chains["cross"] = cross
    elif hasattr(model, "encoder") and hasattr(model.encoder, "sentence_encoder"):
        chains["encoder"] = [layer.self_attn for layer in model.encoder.sentence_encoder.layers]
    else:
        raise AttentionStatsError(
            f"unsupported model {type(model).__name__}: need an encoder-decoder model or a "
            "RoBERTa-style encoder (encoder.sentence_encoder.layers)"
        )
    return chains


@contextlib.contextmanager
def capture_head_weights(modules: Sequence[torch.nn.Module]) -> Iterator[List[List[torch.Tensor]]]:
    """Within the block, every forward of each module in ``modules`` returns and
    records its per-head attention probabilities ``(heads, bsz, tgt, src)``.

    A forward pre-hook sets ``need_weights`` / ``need_head_weights``; fairseq's
    own :class:`MultiheadAttention` (chains with residual attention off) only
    gives per-head weights on its non-fused path, which ``skip_embed_dim_check``
    selects (it changes nothing else). Both are undone on exit.
    """
    records: List[List[torch.Tensor]] = [[] for _ in modules]
    handles = []
    saved_skip = []

    def pre_hook(module, args, kwargs):
        if len(args) > 5:  # need_weights is the 6th positional argument
            raise RuntimeError("attention called with need_weights positionally")
        kwargs["need_weights"] = True
        kwargs["need_head_weights"] = True
        return args, kwargs

    def make_post_hook(index):
        def post_hook(module, args, kwargs, output):
            weights = output[1]
            if weights is None:
                raise RuntimeError(f"{type(module).__name__} returned no attention weights")
            records[index].append(weights.detach())

        return post_hook

    try:
        for i, module in enumerate(modules):
            saved_skip.append(getattr(module, "skip_embed_dim_check", None))
            if saved_skip[-1] is not None:
                module.skip_embed_dim_check = True
            handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
            handles.append(module.register_forward_hook(make_post_hook(i), with_kwargs=True))
        yield records
    finally:
        for handle in handles:
            handle.remove()
        for module, skip in zip(modules, saved_skip):
            if skip is not None:
                module.skip_embed_dim_check = skip


# ---------------------------------------------------------------------------
# input


def read_lines(path: str, what: str) -> List[str]:
    if not os.path.isfile(path):
        raise AttentionStatsError(f"{what} {path}: no such file")
    try:
        with open(path, encoding="utf-8") as fh:
            return [line.rstrip("\n") for line in fh]
    except UnicodeDecodeError as err:
        raise AttentionStatsError(f"{what} {path}: not UTF-8 text ({err})") from None


def _source_prefix(task) -> Optional[int]:
    """The token the task puts before each sentence: masked_lm prepends <s>;
    sentence_prediction its --init-token; translation nothing."""
    from fairseq.tasks.masked_lm import MaskedLMTask
    from fairseq.tasks.sentence_prediction import SentencePredictionTask

    if isinstance(task, SentencePredictionTask):
        return task.cfg.init_token
    if isinstance(task, MaskedLMTask):
        return task.source_dictionary.bos()
    return None


def encode(dictionary, line: str, prefix: Optional[int], max_len: int) -> torch.Tensor:
    tokens = dictionary.encode_line(line, add_if_not_exist=False, append_eos=True).long()
    if prefix is not None:
        tokens = torch.cat([tokens.new([prefix]), tokens])
    if tokens.numel() > max_len:
        tokens = torch.cat([tokens[: max_len - 1], tokens[-1:]])  # keep </s>
    return tokens


def pad_batch(seqs: List[torch.Tensor], pad: int) -> torch.Tensor:
    """Right-padded (bsz, max_len) batch."""
    out = seqs[0].new_full((len(seqs), max(s.numel() for s in seqs)), pad)
    for i, s in enumerate(seqs):
        out[i, : s.numel()] = s
    return out


def _max_positions(model, default: int = 1024) -> Tuple[int, int]:
    mp = model.max_positions()
    if isinstance(mp, tuple):
        src, tgt = mp
    else:
        src = tgt = mp
    src = int(src) if src is not None else default
    tgt = int(tgt) if tgt is not None else default
    return src, tgt


# ---------------------------------------------------------------------------
# the analysis


def load_checkpoint(path: str, data: Optional[str] = None, cpu: bool = True):
    """(model, task) of a fairseq checkpoint; the plugin is imported first."""
    from fairseq import checkpoint_utils

    import realformer_fairseq  # noqa: F401  (registers the models)

    if not os.path.isfile(path):
        raise AttentionStatsError(f"--path {path}: no such checkpoint file")
    overrides = {"data": data} if data else {}
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides=overrides
    )
    model = models[0]
    model.eval()
    if not cpu and torch.cuda.is_available():
        model.cuda()
    return model, task


def analyse(
    model,
    task,
    source_lines: List[str],
    target_lines: Optional[List[str]] = None,
    batch_size: int = 32,
    log_interval: int = 20,
) -> "OrderedDict[str, ChainStats]":
    """Run the lines through ``model`` and collect per-token statistics per chain."""
    from fairseq.models import FairseqEncoderDecoderModel

    enc_dec = isinstance(model, FairseqEncoderDecoderModel)
    chains = attention_chains(model)
    if not enc_dec or target_lines is None:
        chains = OrderedDict((k, v) for k, v in chains.items() if k == "encoder")
    device = next(model.parameters()).device
    src_dict = task.source_dictionary
    tgt_dict = task.target_dictionary if enc_dec else None
    prefix = _source_prefix(task)
    max_src, max_tgt = _max_positions(model)

    stats = OrderedDict(
        (name, ChainStats(name, len(mods), mods[0].num_heads)) for name, mods in chains.items()
    )
    pairs = [
        (i, src, None if target_lines is None else target_lines[i])
        for i, src in enumerate(source_lines)
        if src.strip() and (target_lines is None or target_lines[i].strip())
    ]
    skipped = len(source_lines) - len(pairs)
    if skipped:
        logger.warning("skipped %d empty line(s)", skipped)
    if not pairs:
        raise AttentionStatsError("no non-empty input lines")

    modules = [m for mods in chains.values() for m in mods]
    num_batches = math.ceil(len(pairs) / batch_size)
    with torch.no_grad(), capture_head_weights(modules) as records:
        for b in range(num_batches):
            batch = pairs[b * batch_size : (b + 1) * batch_size]
            src = [encode(src_dict, s, prefix, max_src) for _, s, _ in batch]
            src_tokens = pad_batch(src, src_dict.pad()).to(device)  # (bsz, src_len)
            src_lengths = torch.tensor([s.numel() for s in src], device=device)
            src_mask = src_tokens.ne(src_dict.pad())
            for rec in records:
                rec.clear()
            if not enc_dec:
                model(src_tokens, features_only=True)
            elif target_lines is None:
                model.encoder(src_tokens, src_lengths=src_lengths)
            else:
                tgt = [encode(tgt_dict, t, None, max_tgt) for _, _, t in batch]
                # teacher forcing: </s> moved to the front, as fairseq's collater does
                prev = [torch.cat([t[-1:], t[:-1]]) for t in tgt]
                prev_output_tokens = pad_batch(prev, tgt_dict.pad()).to(device)
                model(src_tokens, src_lengths, prev_output_tokens)
                tgt_mask = prev_output_tokens.ne(tgt_dict.pad())
            offset = 0
            for name, mods in chains.items():
                weights = [records[offset + i][-1] for i in range(len(mods))]
                offset += len(mods)
                if name == "encoder":
                    stats[name].add_batch(weights, src_mask, src_mask)
                elif name == "decoder":
                    stats[name].add_batch(weights, tgt_mask, tgt_mask)
                else:
                    stats[name].add_batch(weights, tgt_mask, src_mask)
            if log_interval and (b + 1) % log_interval == 0:
                logger.info("batch %d / %d", b + 1, num_batches)
    return stats


# ---------------------------------------------------------------------------
# output (each file written to a temporary name, then renamed)


CSV_FIELDS = (
    "chain", "layer", "head", "num_queries",
    "entropy_mean", "entropy_median", "entropy_std", "js_mean", "js_median", "js_std",
)  # fmt: skip


def write_csv(path: str, summaries: Dict[str, dict]):
    with atomic_output(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(CSV_FIELDS)
            for chain, s in summaries.items():
                ent, js = s["entropy"]["per_head"], s["js_divergence"]["per_head"]
                for layer in range(s["num_layers"]):
                    for head in range(s["num_heads"]):
                        row = [chain, layer, head, s["num_queries"]]
                        for d in (ent, js):
                            for key in ("mean", "median", "std"):
                                v = d[key][layer]
                                row.append("" if v is None else f"{v[head]:.6f}")
                        writer.writerow(row)


# ---------------------------------------------------------------------------
# command line


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Per-layer/per-head attention entropy and adjacent-layer JS divergence "
        "(RealFormer, section 4.3) of a fairseq checkpoint on a text file.",
    )
    parser.add_argument("--path", required=True, metavar="CHECKPOINT", help="model checkpoint")
    parser.add_argument(
        "--input",
        required=True,
        metavar="FILE",
        help="one sentence per line, tokenised/BPE'd as the training data; encoded with "
        "the checkpoint's (source) dictionary",
    )
    parser.add_argument(
        "--target",
        metavar="FILE",
        help="encoder-decoder models: parallel target lines, teacher-forced through the "
        "decoder to analyse its self- and cross-attention chains",
    )
    parser.add_argument(
        "--data",
        metavar="DIR",
        help="data directory with the dictionaries (default: the one in the checkpoint)",
    )
    parser.add_argument("--out-dir", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N")
    parser.add_argument(
        "--max-lines", type=int, default=0, metavar="N", help="use the first N lines (0: all)"
    )
    parser.add_argument(
        "--max-plot-points",
        type=int,
        default=50000,
        metavar="N",
        help="violin plots draw at most N random per-token values per layer (0: all)",
    )
    parser.add_argument(
        "--no-plots", action="store_true", help="write JSON and CSV only (no matplotlib needed)"
    )
    parser.add_argument("--cpu", action="store_true", help="run on CPU even if CUDA is available")
    return parser


def main(args) -> dict:
    if not args.no_plots:
        attention_plots.pyplot()  # a missing extra stops here, before any work
    if args.batch_size < 1:
        raise AttentionStatsError(f"--batch-size must be >= 1, got {args.batch_size}")
    source = read_lines(args.input, "--input")
    target = read_lines(args.target, "--target") if args.target else None
    if args.max_lines:
        source = source[: args.max_lines]
        target = target[: args.max_lines] if target is not None else None
    if target is not None and len(target) != len(source):
        raise AttentionStatsError(
            f"--target {args.target}: {len(target)} lines, but --input {args.input} has "
            f"{len(source)}"
        )
    if not any(line.strip() for line in source):
        raise AttentionStatsError(f"--input {args.input}: no non-empty lines")

    model, task = load_checkpoint(args.path, args.data, cpu=args.cpu)
    from fairseq.models import FairseqEncoderDecoderModel

    if target is not None and not isinstance(model, FairseqEncoderDecoderModel):
        raise AttentionStatsError(
            f"--target {args.target}: the checkpoint is an encoder-only model "
            f"({type(model).__name__}); --target is for encoder-decoder models"
        )
    logger.info("model %s, %d input lines", type(model).__name__, len(source))

    stats = analyse(model, task, source, target, batch_size=args.batch_size)
    summaries = OrderedDict((name, s.summary()) for name, s in stats.items())
    for name, s in summaries.items():
        ent = s["entropy"]["per_layer"]["mean"]
        js = s["js_divergence"]["per_layer"]["mean"]
        logger.info(
            "%s: %d queries; mean entropy by layer %s; mean JS by layer %s",
            name,
            s["num_queries"],
            " ".join(f"{v:.3f}" for v in ent),
            " ".join("-" if v is None else f"{v:.3f}" for v in js),
        )

    os.makedirs(args.out_dir, exist_ok=True)
    plots = []
    if not args.no_plots:
        plots = attention_plots.write_plots(args.out_dir, stats, args.max_plot_points)
    result = {
        "checkpoint": os.path.abspath(args.path),
        "input": os.path.abspath(args.input),
        "target": os.path.abspath(args.target) if args.target else None,
        "model": type(model).__name__,
        "arch": getattr(getattr(model, "args", None), "arch", None)
        or getattr(getattr(getattr(model, "cfg", None), "model", None), "_name", None),
        "num_lines": len(source),
        "units": "nats (natural log); JS divergence is at most ln 2",
        "js_definition": "per token: JS(head h of layer l, head h of layer l-1); layer 0: null",
        "chains": summaries,
        "plots": plots,
    }
    write_json_atomic(os.path.join(args.out_dir, "attention_stats.json"), result)
    write_csv(os.path.join(args.out_dir, "attention_stats.csv"), summaries)
    logger.info(
        "wrote attention_stats.json, attention_stats.csv and %d plots to %s",
        len(plots),
        args.out_dir,
    )
    return result


@console_entry_point
def cli_main(argv: Optional[Sequence[str]] = None):
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stdout,
        force=True,  # importing fairseq already configured the root logger
    )
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    run = exit_with_one_line(PROG)(main)
    run(get_parser().parse_args(argv))


if __name__ == "__main__":
    cli_main()
