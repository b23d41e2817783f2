"""How far the rebuilt score streams of the eager and triton routes, and the gradients made from
them, are from float64, over the paper's 60 layers.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747): the WMT'14
recipe's encoder has 60 layers. The eager route keeps one stream per chain for backward and
rebuilds the earlier ones, ``S_{l-1} = S_l - Q_l K_l^T / sqrt(d)``, in place
(modules/routes/kept_stream.py); in float32 ``fl(fl(S_{l-1} + X) - X)`` is not ``S_{l-1}``,
so the rebuilt streams drift by up to a rounding per layer on the way down.

For each chain shape of ``studies.route_precision`` (decoder self-attention with the causal
mask, encoder self-attention, cross-attention; four sequences: unpadded, right half padded,
left half padded, fully padded) and both modes, a chain of 60 layers (64 wide, 4 heads, 16
tokens) in which every layer attends from the same inputs, so that the layers are tied only by
the stream (what the rebuild changes), and the loss weighs every layer's output at random:

* ``stream``: max |rebuilt S_l - S_l| / max |S_l| over the layers, both float32, S_l as the
  forward made it (the rebuild's own drift), and against float64;
* ``gradient``: max |float32 gradient - float64 gradient| / max |float64 gradient| over the
  inputs and every parameter, for the kept stream and for the plain route (``kept_stream =
  False``, autograd keeping every layer's probabilities) side by side.

The triton route (``--routes triton``, its kernels under Triton's interpreter) the same way: its
layers keep one stream per chain (``one_stream_per_chain``, the default) against the same
layers keeping each its own, both float32, against float64 eager (on the causal chain, the
streams on and below the diagonal: the route's holds 0 after it).

usage (from the repository root; eager: about a minute on one core; triton: some minutes):
    python -m studies.stream_precision    # -> docs/benchmarks/stream_precision.json
    TRITON_INTERPRET=1 .venv-triton/bin/python -m studies.stream_precision --routes triton
"""

import argparse
import copy
import platform
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from realformer_fairseq.modules.routes import shared

from .route_precision import CASES, inputs, layer_of
from .runs import REPO_ROOT, read_json, write_json
from .tables import md_table

DEPTH, LENGTH = 60, 16


def chain(case: str, mode: str, depth: int) -> List:
    """``depth`` float64 eager layers of ``case`` (seeded), on the plain route."""
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        module = layer_of("eager", case).double().train()
        module.residual_attention_mode = mode
        module.one_stream_per_chain = False
        layers.append(module)
    return layers


def run(layers, case: str, length: int, dtype: torch.dtype, streams: Optional[List] = None):
    """Every layer attends from the same inputs, the stream handed on; backward of a random
    weighting of all outputs. Returns the gradients of the inputs and of every parameter;
    ``streams`` (a list) gets each layer's stream as the forward made it."""
    query, keys, attn_mask, padding = (
        None if t is None else t.to(dtype) if t.is_floating_point() else t
        for t in inputs(case, length)
    )
    query.requires_grad_()
    if keys is not None:
        keys.requires_grad_()
    kv = query if keys is None else keys
    weights = torch.Generator().manual_seed(2)
    stream, loss = None, 0.0
    for idx, module in enumerate(layers):
        out, _, stream, _, _ = module(
            query, kv, kv, key_padding_mask=padding, attn_mask=attn_mask, need_weights=False,
            prev_attn_scores=stream, layer_idx=idx,
        )  # fmt: skip
        if streams is not None:
            streams.append(stream.detach().clone())
        weight = torch.randn(out.shape, generator=weights, dtype=torch.float64).to(dtype)
        loss = loss + (out * weight).sum()
    loss.backward()
    return (
        [query.grad]
        + ([] if keys is None else [keys.grad])
        + [p.grad for module in layers for p in module.parameters()]
    )


def gradient_error(got: List, truth: List) -> float:
    scale = max(t.abs().max().item() for t in truth)
    return max((g.double() - t).abs().max().item() for g, t in zip(got, truth)) / scale


def rebuilt_streams(layers, case: str, length: int):
    """The float32 kept-stream run: its gradients, the streams of its forward and the streams
    its backward rebuilt (the argument of each ``StreamLink.keep`` during backward), by layer."""
    forward: List = []
    rebuilt: Dict[int, torch.Tensor] = {}
    links: Dict[int, int] = {}
    keep = shared.StreamLink.keep

    def recording_keep(link, stream):
        if id(link) not in links:  # the forward's keep of a new layer's stream
            links[id(link)] = len(links)
        else:  # backward: the rebuilt stream of that link's layer
            rebuilt[links[id(link)]] = stream.detach().clone()
        keep(link, stream)

    shared.StreamLink.keep = recording_keep
    try:
        grads = run(layers, case, length, torch.float32, forward)
    finally:
        shared.StreamLink.keep = keep
    return grads, forward, rebuilt


def float32_layers(reference: List, case: str, route: str, one_stream: bool) -> List:
    """``reference``'s weights in float32 layers of ``route``: keeping one stream per chain
    (``one_stream``) or each layer its own (the eager route's plain autograd; the triton
    route's ``one_stream_per_chain = False``)."""
    if route == "eager":
        layers = [m.float() for m in copy.deepcopy(reference)]
        for module in layers:
            module.one_stream_per_chain = one_stream
        return layers
    layers = []
    for module in reference:
        fused = layer_of(route, case).double()
        fused.load_state_dict(module.state_dict())
        fused.residual_attention_mode = module.residual_attention_mode
        fused.one_stream_per_chain = one_stream
        layers.append(fused.float().train())
    return layers


def measure(
    case: str, mode: str, depth: int = DEPTH, length: int = LENGTH, route: str = "eager"
) -> Dict:
    reference = chain(case, mode, depth)
    truth_streams: List = []
    truth = run(reference, case, length, torch.float64, truth_streams)
    if route == "triton" and case.startswith("decoder"):
        # the triton route's causal stream holds 0 after the diagonal (what no softmax reads;
        # triton_function.residual_attention): compared where the eager route's is read
        truth_streams = [t.tril() for t in truth_streams]
    row: Dict = {"route": route, "case": case, "mode": mode, "layers": depth, "tokens": length}
    plain = float32_layers(reference, case, route, one_stream=False)
    row["gradient_plain_float32"] = gradient_error(run(plain, case, length, torch.float32), truth)
    kept = float32_layers(reference, case, route, one_stream=True)
    grads, forward, rebuilt = rebuilt_streams(kept, case, length)
    row["gradient_kept_stream_float32"] = gradient_error(grads, truth)
    if sorted(rebuilt) != list(range(depth - 1)):
        raise RuntimeError(f"rebuilt streams of layers {sorted(rebuilt)}, not 0..{depth - 2}")
    drift = [(rebuilt[i] - forward[i]).abs().max() / forward[i].abs().max() for i in rebuilt]
    off64 = [(rebuilt[i].double() - truth_streams[i]).abs().max() / truth_streams[i].abs().max()
             for i in rebuilt]  # fmt: skip
    forward64 = [(forward[i].double() - truth_streams[i]).abs().max()
                 / truth_streams[i].abs().max() for i in rebuilt]  # fmt: skip
    row["stream_rebuilt_vs_forward_float32"] = max(drift).item()
    row["stream_rebuilt_vs_float64"] = max(off64).item()
    row["stream_forward_float32_vs_float64"] = max(forward64).item()
    return row


def format_table(rows: List[Dict]) -> str:
    header = ["route", "chain", "mode", "rebuilt S_l vs forward's (fp32)", "rebuilt S_l vs fp64",
              "forward's S_l vs fp64", "gradients, one stream per chain fp32",
              "gradients, every layer's own fp32"]  # fmt: skip
    return md_table(header, [
        [r.get("route", "eager"), r["case"], r["mode"],
         f"{r['stream_rebuilt_vs_forward_float32']:.1e}",
         f"{r['stream_rebuilt_vs_float64']:.1e}", f"{r['stream_forward_float32_vs_float64']:.1e}",
         f"{r['gradient_kept_stream_float32']:.1e}", f"{r['gradient_plain_float32']:.1e}"]
        for r in rows
    ])  # fmt: skip


def main(argv=None) -> Dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=DEPTH)
    p.add_argument("--tokens", type=int, default=LENGTH)
    p.add_argument(
        "--routes", nargs="+", choices=("eager", "triton"), default=["eager"],
        help="triton: its kernels under Triton's interpreter (TRITON_INTERPRET=1 set before "
        "start); rows are merged into the JSON by route, chain and mode",
    )  # fmt: skip
    p.add_argument(
        "--json", type=Path, default=REPO_ROOT / "docs" / "benchmarks" / "stream_precision.json"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    rows = [measure(case, mode, args.layers, args.tokens, route)
            for route in args.routes for case in CASES for mode in ("sum", "mean")]  # fmt: skip
    # merged with the file's rows of other routes (another run may have written them)
    key = lambda r: (r.get("route", "eager"), r["case"], r["mode"])  # noqa: E731
    previous = {key(r): r for r in (read_json(args.json) or {}).get("rows", [])}
    rows = list({**previous, **{key(r): r for r in rows}}.values())
    report = {
        "description": __doc__.split("\n\n")[0],
        "method": "errors relative to the largest |value| of the float64 reference (streams: "
        "of that layer's stream; gradients: of all gradients); see the module docstring",
        "machine": {"torch": torch.__version__, "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d"),
        "wall_seconds": round(time.time() - t0, 1),
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.json, report)
    print(format_table(rows))
    return report


if __name__ == "__main__":
    main()
