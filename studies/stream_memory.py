"""What each route of residual attention keeps from forward to backward, as the encoder grows.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747): every layer
of a chain adds its raw scores to a T x T float32 stream. Issue 51: a chain needs to keep one
stream for backward, its last, and can rebuild the earlier ones on the way down
(``S_l = S_{l+1} - Q_{l+1} K_{l+1}^T / sqrt(d)``); what each route keeps instead grows with
depth times length squared.

For the realformer encoder-decoder (``realformer_transformer``: residual attention on all three
chains, running mean, ADMIN with ``--init-type admin-closed-form``) at ``--encoder-layers`` 6
and 12 (6 decoder layers), 512 source and 512 target tokens, small width, one training forward
on CPU (attention dropout 0.1, label smoothed cross-entropy), it counts every tensor autograd saves
(``studies.saved_tensors.SavedTensorLog``'s pack hook) plus every tensor a route's autograd
nodes hold themselves (attributes of custom-function contexts, one object level deep, such as
the eager route's kept stream), each storage once; parameters are left out. "Score bytes" are
those of the T x T-sized tensors (last two dimensions 512 x 512: probabilities, dropout masks,
streams, the causal mask).

Routes: ``eager`` (``--residual-attention-impl eager``: plain autograd, each layer's
probabilities, dropout mask and dropped probabilities kept), ``eager_kept_stream`` (the same
modules with ``one_stream_per_chain = True``, off by default: one kept stream per chain, the earlier ones
rebuilt in backward, modules/routes/kept_stream.py), and ``triton`` (``--residual-attention-impl
triton``, only where triton is installed and ``TRITON_INTERPRET=1`` runs its kernels on CPU).
``triton_concat_phase``: the triton route with the switch depth set to 24 for every shape (the
rule's D is 0 as derived, routes/rules.py), so that every chain of up to 24 layers runs the
concat phase but where a layer returns its probabilities (the last cross-attention, fairseq's
alignment layer, which forms the stream). Rows are merged into
the JSON by (route, encoder layers, tokens), so a run of one route updates its rows only.

Beside the count, the cost of the kept stream (its backward recomputes each layer's scores,
probabilities and dropout mask): the CPU time of a training step (forward and backward, no
optimizer) of ``eager_kept_stream`` against ``eager``, the same weights and batch,
alternating in this process (``--time-steps``, the median per route; process CPU time on one
thread, so that other processes on the machine weigh less), at 6 encoder layers, with attention
dropout 0.1 and 0.

usage (from the repository root; one forward per row, no backward, no timing):
    TRITON_INTERPRET=1 .venv-triton/bin/python -m studies.stream_memory   # all four routes
    TRITON_INTERPRET=1 .venv-triton/bin/python -m studies.stream_memory --routes triton \
        triton_concat_phase --encoder-layers 2 6 --tokens 48 --time-steps 0
    .venv/bin/python -m studies.stream_memory --routes eager eager_kept_stream
    python -m studies.stream_memory --tokens 64 --json /tmp/stream_memory.json   # quick look
"""

import argparse
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Dict, List

import torch

from .bench_models import (
    IMPL_EAGER,
    IMPL_TRITON,
    build,
    dummy_dictionary,
    make_batch,
    quiet_route_logs,
)
from .runs import REPO_ROOT, read_json, write_json
from .saved_tensors import MIB, OUTSIDE, SavedTensorLog
from .tables import md_table

ROUTES = ("eager", "eager_kept_stream", "triton", "triton_concat_phase")
# the triton route with every chain in the concat phase up to this depth (the rule's D, which
# is 0 as derived: routes/rules.py), so that what a chain within D keeps is counted
CONCAT_PHASE_DEPTH = 24
SIZES = dict(dec_layers=6, width=64, ffn=256, heads=4)
BATCH = 2
# ADMIN with its data-free omega: no profiling forward (Triton's interpreter is slow)
FLAGS = ("--attention-dropout", "0.1", "--init-type", "admin-closed-form")
HELD = "held by the route's autograd nodes"


def triton_runs_here() -> bool:
    """Whether the triton route's kernels run in this process: triton importable and its
    interpreter on (this is a CPU study)."""
    from realformer_fairseq.settings import triton_installed

    return triton_installed() and os.environ.get("TRITON_INTERPRET") == "1"


def node_held_tensors(loss: torch.Tensor) -> List[torch.Tensor]:
    """Tensors that the autograd graph of ``loss`` holds outside ``save_for_backward``:
    attributes of custom-function contexts (and of the objects, lists and tuples in them, one
    level deep), modules left out (their parameters are not activations)."""
    found, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(next_node for next_node, _ in node.next_functions)
        for value in getattr(node, "__dict__", {}).values():
            found.extend(_tensors_in(value, depth=1))
    return found


def _tensors_in(value, depth: int) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, torch.nn.Module) or depth < 0:
        return []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v, depth - 1)]
    slots = getattr(type(value), "__slots__", ())
    fields = [getattr(value, name, None) for name in slots]
    fields += list(getattr(value, "__dict__", {}).values())
    return [t for v in fields for t in _tensors_in(v, depth - 1)]


def measure(route: str, encoder_layers: int, tokens: int, dictionary) -> Dict:
    """One row: what ``route`` keeps for the backward of one training forward."""
    if route == "triton_concat_phase":
        from realformer_fairseq.modules.routes import rules

        table = rules.CONCAT_PHASE_DEPTHS
        rules.CONCAT_PHASE_DEPTHS = {
            ((9, 0), w, h): ((1, CONCAT_PHASE_DEPTH),) for w in (2, 4) for h in (32, 64, 128)
        }  # fmt: skip
        try:
            return dict(measure("triton", encoder_layers, tokens, dictionary),
                        route=route, concat_phase_depth=CONCAT_PHASE_DEPTH)  # fmt: skip
        finally:
            rules.CONCAT_PHASE_DEPTHS = table
    sizes = dict(SIZES, enc_layers=encoder_layers)
    impl = IMPL_TRITON if route == "triton" else IMPL_EAGER
    model, criterion = build("realformer_transformer", sizes, dictionary, flags=(*impl, *FLAGS))
    if route == "eager_kept_stream":
        for module in model.modules():
            if hasattr(module, "one_stream_per_chain"):
                module.one_stream_per_chain = True
    sample = make_batch(dictionary, BATCH, tokens, tokens, seed=tokens)
    model.train()
    layers = [*model.encoder.layers, *model.decoder.layers]
    log = SavedTensorLog(model, tokens, layers=layers)
    handles = log.hooks()
    try:
        with torch.autograd.graph.saved_tensors_hooks(log.pack, lambda t: t):
            loss = criterion(model, sample)[0]
    finally:
        for handle in handles:
            handle.remove()
    for tensor in node_held_tensors(loss):
        if tensor.numel() > 0:
            log.add(tensor, HELD)
    del loss
    kept = list(log.storages.values())
    heads = sizes["heads"]
    return {
        "route": route,
        "encoder_layers": encoder_layers,
        "tokens": tokens,
        "score_bytes_kept": sum(s[1] for s in kept if s[2]),
        "total_bytes_kept": sum(s[1] for s in kept),
        "decoder_layers": sizes["dec_layers"],
        "batch_size": BATCH,
        # one float32 (batch*heads, T, T) stream: the unit of the table
        "stream_bytes": BATCH * heads * tokens * tokens * 4,
        "score_sized_tensors": sorted(s[3] for s in kept if s[2]),
        "held_by_route_nodes": sorted(s[3] for s in kept if s[0] == HELD),
        "outside_layers_bytes": sum(s[1] for s in kept if s[0] == OUTSIDE),
    }


def time_eager_routes(
    tokens: int, encoder_layers: int, steps: int, dictionary, attention_dropout: str = "0.1"
) -> Dict:
    """Median process CPU seconds of a training step (forward + backward) of ``eager`` and
    ``eager_kept_stream``, alternating, after one untimed step each; their ratio."""
    sizes = dict(SIZES, enc_layers=encoder_layers)
    flags = (*IMPL_EAGER, *FLAGS, "--attention-dropout", attention_dropout)
    models = {}
    for route in ("eager", "eager_kept_stream"):
        model, criterion = build("realformer_transformer", sizes, dictionary, flags=flags)
        for module in model.modules():
            if hasattr(module, "one_stream_per_chain"):
                module.one_stream_per_chain = route == "eager_kept_stream"
        models[route] = (model.train(), criterion)
    models["eager_kept_stream"][0].load_state_dict(models["eager"][0].state_dict())
    sample = make_batch(dictionary, BATCH, tokens, tokens, seed=tokens)
    seconds = {route: [] for route in models}
    for step in range(steps + 1):
        for route, (model, criterion) in models.items():
            started = time.process_time()
            criterion(model, sample)[0].backward()
            if step > 0:
                seconds[route].append(time.process_time() - started)
            model.zero_grad(set_to_none=True)
    median = {route: statistics.median(values) for route, values in seconds.items()}
    return {
        "tokens": tokens,
        "encoder_layers": encoder_layers,
        "attention_dropout": float(attention_dropout),
        "steps": steps,
        "cpu_seconds_per_step": {r: round(v, 4) for r, v in median.items()},
        "kept_stream_over_eager": round(median["eager_kept_stream"] / median["eager"], 3),
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
    }


def format_table(rows: List[Dict]) -> str:
    header = ["route", "encoder layers", "tokens", "score MiB kept", "÷ one stream",
              "total MiB kept", "score MiB per added encoder layer"]  # fmt: skip
    by_key = {(r["route"], r["encoder_layers"], r["tokens"]): r for r in rows}
    lines = []
    for r in sorted(
        rows, key=lambda r: (ROUTES.index(r["route"]), r["tokens"], r["encoder_layers"])
    ):
        growth = "-"
        shallower = [k for k in by_key if k[0] == r["route"] and k[2] == r["tokens"]
                     and k[1] < r["encoder_layers"]]  # fmt: skip
        if shallower:
            base = by_key[max(shallower, key=lambda k: k[1])]
            added = r["encoder_layers"] - base["encoder_layers"]
            growth = f"{(r['score_bytes_kept'] - base['score_bytes_kept']) / added / MIB:.2f}"
        lines.append([
            r["route"], r["encoder_layers"], r["tokens"], f"{r['score_bytes_kept'] / MIB:.1f}",
            f"{r['score_bytes_kept'] / r['stream_bytes']:.2f}",
            f"{r['total_bytes_kept'] / MIB:.1f}", growth,
        ])  # fmt: skip
    return md_table(header, lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--routes", nargs="+", choices=ROUTES, default=None,
        help="default: all four where triton runs here, else the two eager ones",
    )  # fmt: skip
    p.add_argument("--encoder-layers", nargs="+", type=int, default=[6, 12])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--time-steps", type=int, default=9,
                   help="timed training steps per eager route (0: no timing)")  # fmt: skip
    p.add_argument(
        "--json", type=Path, default=REPO_ROOT / "docs" / "benchmarks" / "stream_memory.json"
    )
    return p.parse_args(argv)


def main(argv=None) -> Dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    quiet_route_logs()
    logging.getLogger("realformer_fairseq.modules.routes.triton_route").setLevel(logging.INFO)
    routes = args.routes or [r for r in ROUTES if "triton" not in r or triton_runs_here()]
    if any("triton" in r for r in routes) and not triton_runs_here():
        raise SystemExit("the triton route needs triton installed and TRITON_INTERPRET=1 here")
    dictionary = dummy_dictionary(args.vocab)
    rows, timing = {}, {}
    t0 = time.time()
    for route in routes:
        for layers in args.encoder_layers:
            started = time.time()
            row = measure(route, layers, args.tokens, dictionary)
            row["seconds"] = round(time.time() - started, 1)
            row["date"] = time.strftime("%Y-%m-%d")
            row["torch"] = torch.__version__
            rows[(route, layers, args.tokens)] = row
            print(f"{route} {layers} encoder layers: {row['score_bytes_kept'] / MIB:.1f} MiB "
                  f"score-sized, {row['total_bytes_kept'] / MIB:.1f} MiB in all "
                  f"({row['seconds']} s)", flush=True)  # fmt: skip
    for dropout in ("0.1", "0.0"):
        if args.time_steps <= 0 or "eager" not in routes or "eager_kept_stream" not in routes:
            break
        row = time_eager_routes(args.tokens, 6, args.time_steps, dictionary, dropout)
        timing[f"{args.tokens} tokens, attention dropout {dropout}"] = row
        ratio, seconds = row["kept_stream_over_eager"], row["cpu_seconds_per_step"]
        print(f"training step, {args.tokens} tokens, attention dropout {dropout}: "
              f"eager_kept_stream {ratio}x eager's CPU time ({seconds})", flush=True)  # fmt: skip
    # merged with the file as it is now (another run may have written it meanwhile)
    previous = read_json(args.json) or {}
    rows = {**{(r["route"], r["encoder_layers"], r["tokens"]): r
               for r in previous.get("rows", [])}, **rows}  # fmt: skip
    timing = {**previous.get("timing", {}), **timing}
    report = {
        "description": __doc__.split("\n\n")[0],
        "method": "saved_tensors_hooks pack hook during one training forward plus the tensors "
        "the graph's custom-function contexts hold (one object level deep); each storage "
        "once; parameters excluded; score bytes: tensors whose last two dimensions are "
        "(tokens, tokens)",
        "model": dict(arch="realformer_transformer", **SIZES, batch_size=BATCH, flags=FLAGS),
        "machine": {"torch": torch.__version__, "python": platform.python_version()},
        "last_run": {"date": time.strftime("%Y-%m-%d"), "wall_seconds": round(time.time() - t0, 1)},
        "rows": sorted(rows.values(), key=lambda r: (r["route"], r["tokens"], r["encoder_layers"])),
        "timing": timing,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.json, report)
    print(format_table(report["rows"]))
    return report


if __name__ == "__main__":
    main()
