"""The GPU check's cases: RealFormer against the model it is compared with, at the sizes users
train, each step fairseq's own ``Trainer.train_step`` (``studies.bench_trainer``).

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Very Deep Transformers for Neural Machine Translation" (arXiv 2008.07772).

Per case and dtype the baseline is built once; each route of the residual score chains
(``--residual-attention-impl``: eager, concat, auto, triton) is built beside it, both get the
same batches, timed interleaved in one process (A B, then B A, ...; the GPU synchronised around
each timed stretch), then freed. A row per route: words/s and peak memory of both, their ratio,
the optimizer the flags built, the SDPA backend the baseline's attention ran (from the
profiler's op and kernel names), the kernels the route ran, and ``studies.triton_cost``'s
prediction beside the measurement. Sizes live in ``CASES`` (a GPU) and ``SMOKE_CASES`` (toy
sizes on CPU: the same code).
"""

import gc
import statistics
from typing import Callable, Dict, List, Optional

import torch

from . import bench_trainer as bt
from .bench_measure import interleaved_rates, peak_bytes, synchronize
from .bench_models import IMPL_CONCAT, IMPL_EAGER, IMPL_TRITON
from .runs import DEFAULT_DATA

# the routes of the residual score chains, by --residual-attention-impl ("auto" gives none)
ROUTES = {"eager": IMPL_EAGER, "concat": IMPL_CONCAT, "auto": (), "triton": IMPL_TRITON}
NEWSTEST = tuple(
    (
        DEFAULT_DATA / "moses_reference" / f"newstest{year}.train-tok.en",
        DEFAULT_DATA / "moses_reference" / f"newstest{year}.train-tok.fr",
    )
    for year in (2012, 2013, 2014)
)
BIG = dict(enc_layers=6, dec_layers=6, width=1024, ffn=4096, heads=16)
DEEP = dict(enc_layers=60, dec_layers=12, width=512, ffn=2048, heads=8)
BERT_BASE = dict(enc_layers=12, width=768, ffn=3072, heads=12)
# on an out-of-memory error a case is tried again with the next of its fallbacks
CASES = {
    # WMT'14's big transformer at 4096 tokens a GPU; lengths from newstest2012-14's histogram
    "wmt_big": dict(
        task="translation", baseline="transformer_vaswani_wmt_en_fr_big",
        realformer="realformer_transformer", sizes=BIG, vocab=40000, dtypes=("fp16",),
        batch=dict(max_tokens=4096, batches=4, scale=1.0, max_length=1024),
    ),
    # the paper's 60L-12L: ADMIN against RealFormer+ADMIN; 18L-6L where it does not fit
    "admin_60_12": dict(
        task="translation", baseline="admin_transformer_wmt_en_fr_60_12",
        realformer="realformer_wmt_en_fr_60_12", sizes=DEEP, vocab=40000, dtypes=("fp16",),
        batch=dict(max_tokens=4096, batches=4, scale=1.0, max_length=1024),
        fallbacks=[dict(sizes=dict(DEEP, enc_layers=18, dec_layers=6))],
    ),
    # BERT-base pre-training on full 512-token blocks: no padding, so no mask, so flash
    "bert_base_512": dict(
        task="masked_lm", baseline="roberta_base", realformer="realformer_bert_base",
        sizes=BERT_BASE, vocab=50265, dtypes=("bf16", "fp16"),
        batch=dict(length=512, sequences=32),
        fallbacks=[dict(batch=dict(length=512, sequences=n)) for n in (16, 8)],
    ),
    "long_2048": dict(
        task="masked_lm", baseline="roberta_base", realformer="realformer_bert_base",
        sizes=BERT_BASE, vocab=50265, dtypes=("fp16",), batch=dict(length=2048, sequences=8),
        fallbacks=[dict(batch=dict(length=2048, sequences=n)) for n in (4, 2)],
    ),
    "long_4096": dict(
        task="masked_lm", baseline="roberta_base", realformer="realformer_bert_base",
        sizes=BERT_BASE, vocab=50265, dtypes=("fp16",), batch=dict(length=4096, sequences=4),
        fallbacks=[dict(batch=dict(length=4096, sequences=n)) for n in (2, 1)],
    ),
}  # fmt: skip
TOY_TRANSLATION = dict(enc_layers=2, dec_layers=2, width=32, ffn=64, heads=2)
TOY_ENCODER = dict(enc_layers=2, width=32, ffn=64, heads=2)
SMOKE_CASES = {
    "wmt_big": dict(CASES["wmt_big"], sizes=TOY_TRANSLATION, vocab=100,
                    batch=dict(max_tokens=64, batches=2, scale=0.25, max_length=16)),
    "admin_60_12": dict(CASES["admin_60_12"], sizes=dict(TOY_TRANSLATION, enc_layers=3),
                        vocab=100, batch=dict(max_tokens=64, batches=2, scale=0.25, max_length=16),
                        fallbacks=[]),
    "bert_base_512": dict(CASES["bert_base_512"], sizes=TOY_ENCODER, vocab=100,
                          batch=dict(length=16, sequences=4), fallbacks=[]),
    "long_2048": dict(CASES["long_2048"], sizes=TOY_ENCODER, vocab=100,
                      batch=dict(length=32, sequences=2), fallbacks=[]),
    "long_4096": dict(CASES["long_4096"], sizes=TOY_ENCODER, vocab=100,
                      batch=dict(length=64, sequences=1), fallbacks=[]),
}  # fmt: skip
TIMING = dict(warmup=2, repeats=3)
SMOKE_TIMING = dict(warmup=1, repeats=1)


def max_positions(case: Dict) -> int:
    batch = case["batch"]
    return batch["length"] if case["task"] == "masked_lm" else batch["max_length"]


def case_batches(case: Dict, dictionary, seed: int = 1) -> List[Dict]:
    batch = case["batch"]
    if case["task"] == "masked_lm":
        return [bt.masked_lm_batch(dictionary, batch["sequences"], batch["length"], seed)]
    lengths = bt.corpus_lengths(NEWSTEST)
    return bt.translation_batches(
        dictionary, lengths, batch["max_tokens"], batch["batches"], seed, batch["scale"],
        batch["max_length"],
    )  # fmt: skip


def build(case: Dict, arch: str, dtype: str, device: str, dictionary, flags=()):
    argv = bt.trainer_argv(
        case["task"], arch, case["sizes"], dtype, max_positions(case), device, flags
    )
    return bt.TrainerBench(arch, case["task"], argv, dictionary)


def route_available(route: str, device: str) -> Optional[str]:
    """Why ``route`` cannot run here, or None."""
    if route != "triton":
        return None
    from realformer_fairseq.settings import TRITON_INSTALL, triton_installed

    if not triton_installed():
        return f"triton is not installed ({TRITON_INSTALL})"
    import os

    if not device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        return "the triton route on CPU needs Triton's interpreter (TRITON_INTERPRET=1)"
    return None


def route_kernels(bench) -> List[str]:
    return sorted({m.last_kernel for m in bench.model.modules() if hasattr(m, "last_kernel")})


def describe_batches(batches: List[Dict]) -> Dict:
    sentences = [int(b["nsentences"]) for b in batches]
    shapes = [list(b["net_input"]["src_tokens"].shape) for b in batches]
    return dict(count=len(batches), sentences=sentences, src_shapes=shapes,
                target_tokens=[bt.batch_tokens(b) for b in batches])  # fmt: skip


def free(device: str):
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def measure_pair(base, bench, batches: List[Dict], device: str, timing: Dict) -> Dict:
    """Warm-up (ADMIN's profiling, Triton's compiles), peak memory of one step each, then
    words/s of both over the same batches, interleaved."""
    for _ in range(timing["warmup"]):
        for b in batches:
            base.train_step(b)
            bench.train_step(b)

    def run_all(x):
        return lambda: [x.train_step(b) for b in batches]

    memory = {
        "baseline": peak_bytes(run_all(base), device) + base.persistent_bytes(),
        "realformer": peak_bytes(run_all(bench), device) + bench.persistent_bytes(),
    }
    tokens = sum(bt.batch_tokens(b) for b in batches)
    updates_before = {"baseline": base.trainer.get_num_updates(),
                      "realformer": bench.trainer.get_num_updates()}  # fmt: skip
    wps = interleaved_rates(
        {"baseline": run_all(base), "realformer": run_all(bench)},
        {"baseline": tokens, "realformer": tokens}, timing["repeats"], 1, device,
    )  # fmt: skip
    calls = timing["repeats"] * len(batches)
    skipped = {  # fp16 overflow: fairseq skips the optimizer's step, the step does less work
        "baseline": calls - (base.trainer.get_num_updates() - updates_before["baseline"]),
        "realformer": calls - (bench.trainer.get_num_updates() - updates_before["realformer"]),
    }
    ratio = [r / b for r, b in zip(wps["realformer"], wps["baseline"])]
    return dict(
        train_wps=wps, peak_memory_bytes=memory, updates_skipped=skipped,
        ratios=dict(train_wps=statistics.median(ratio),
                    peak_memory=memory["realformer"] / memory["baseline"]),
    )  # fmt: skip


def case_rows(
    name: str, case: Dict, device: str, timing: Dict, routes=tuple(ROUTES),
    on_row: Callable[[str, Dict], None] = lambda key, row: None,
    predict: Optional[Callable[[Dict], Dict]] = None,
) -> Dict[str, Dict]:  # fmt: skip
    """Every dtype x route row of one case; ``on_row(key, row)`` as soon as a row is measured
    (``studies.gpu_check`` writes it out then). An out-of-memory error retries the case with its
    next fallback (smaller sizes or fewer sequences), said in the rows."""
    rows = {}
    for dtype in case["dtypes"]:
        attempts = [{}] + list(case.get("fallbacks", []))
        for i, fallback in enumerate(attempts):
            sized = dict(case, **fallback)
            try:
                rows.update(dtype_rows(name, sized, dtype, device, timing, routes, on_row,
                                       predict, fallback_used=i > 0, rows_done=rows))  # fmt: skip
                break
            except torch.cuda.OutOfMemoryError:
                free(device)
                if i == len(attempts) - 1:
                    raise
    return rows


def dtype_rows(name, case, dtype, device, timing, routes, on_row, predict, fallback_used,
               rows_done) -> Dict[str, Dict]:  # fmt: skip
    dictionary = bt.dictionary_for(case["task"], case["vocab"])
    batches = case_batches(case, dictionary)
    rows = {}
    base = build(case, case["baseline"], dtype, device, dictionary)
    base.train_step(batches[0])  # warm-up before the profile
    names = bt.profiled_names(lambda: base.train_step(batches[0]), device)
    backend = bt.sdpa_backend(names, device)
    for route in routes:
        key = f"{name} {dtype} {route}"
        if key in rows_done:
            continue
        common = dict(case=name, dtype=dtype, route=route, step=bt.step_function_name(),
                      baseline_arch=case["baseline"], arch=case["realformer"],
                      sizes=case["sizes"], batch=case["batch"],
                      fallback_used=fallback_used)  # fmt: skip
        why_not = route_available(route, device)
        if why_not:
            rows[key] = dict(common, skipped=why_not)
            on_row(key, rows[key])
            continue
        bench = build(case, case["realformer"], dtype, device, dictionary, ROUTES[route])
        row = dict(
            common,
            optimizer=bench.optimizer_name,
            inner_optimizer=bench.inner_optimizer_name,
            flattened=bench.flattened,
            baseline_optimizer=base.optimizer_name,
            argv=bench.argv[1:],
            baseline_argv=base.argv[1:],
            overrides=bench.overrides,
            batches=describe_batches(batches),
            sdpa_backend=backend,
            **measure_pair(base, bench, batches, device, timing),
        )
        row["kernels"] = route_kernels(bench)
        if predict is not None:
            row["predicted"] = predict(row)
        rows[key] = row
        on_row(key, row)
        del bench
        free(device)
    del base
    free(device)
    synchronize(device)
    return rows
