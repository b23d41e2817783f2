"""The speed benchmark of RealFormer (He et al. 2020, arXiv 2012.11747) against fairseq's
transformer (``studies.benchmark_speed``, ``studies.bench_models``, ``studies.bench_measure``):
each variant builds the model it claims, with the sizes its config names; the persistent bytes
are what Adam really keeps; the timing interleaves and the ratio is the median of per-repeat
ratios; the CPU peak sees a known allocation; the ✓/✗ marks follow each target's direction. The
toy end-to-end run of the command is under ``-m slow``."""

import json
import math
import sys

import pytest
import torch
from fairseq import options
from fairseq.modules import MultiheadAttention
from harness import run

from realformer_fairseq.modules.admin import AdminResidual
from realformer_fairseq.modules.routes import RealformerMultiheadAttention
from studies import bench_measure, bench_models, benchmark_speed
from studies.bench_models import Bench, dummy_dictionary, make_batch

TOY = benchmark_speed.CONFIGS["toy"]


def toy_bench(name, dtype=torch.float32):
    return Bench(name, TOY, dummy_dictionary(TOY["vocab"]), dtype=dtype)


# ---------------------------------------------------------------------------
# the models


@pytest.mark.parametrize("config", sorted(benchmark_speed.CONFIGS))
def test_every_config_reaches_fairseqs_arguments(config):
    """Each size of the config arrives in fairseq's parsed arguments (a flag dropped from
    train_argv would leave fairseq's default there), for every variant's arch."""
    cfg = benchmark_speed.CONFIGS[config]
    for variant in bench_models.VARIANTS.values():
        parser = options.get_training_parser(default_task="translation")
        argv = bench_models.train_argv(variant.arch, cfg, flags=variant.flags)
        args = options.parse_args_and_arch(parser, input_args=argv)
        assert args.arch == variant.arch
        assert (args.encoder_layers, args.decoder_layers) == (cfg["enc_layers"], cfg["dec_layers"])
        assert args.encoder_embed_dim == args.decoder_embed_dim == cfg["width"]
        assert args.encoder_ffn_embed_dim == args.decoder_ffn_embed_dim == cfg["ffn"]
        assert args.encoder_attention_heads == args.decoder_attention_heads == cfg["heads"]
    assert benchmark_speed.config_label(cfg) == (
        f"{cfg['enc_layers']}L-{cfg['dec_layers']}L d{cfg['width']} ffn{cfg['ffn']} "
        f"h{cfg['heads']}, length {cfg['src_len']}"
    )


def test_the_issue_sizes_are_measured_by_default():
    """The default run covers 6L-6L d512 and 60L-12L at length 32 and d256 at 128, 512, 1024."""
    defaults = benchmark_speed.parse_args([]).configs
    labels = [benchmark_speed.config_label(benchmark_speed.CONFIGS[c]) for c in defaults]
    assert labels == [
        "6L-6L d512 ffn2048 h8, length 32",
        "60L-12L d128 ffn512 h4, length 32",
        "6L-6L d256 ffn1024 h4, length 128",
        "6L-6L d256 ffn1024 h4, length 512",
        "6L-6L d256 ffn1024 h4, length 1024",
    ]


def attention_modules(model):
    chains = {
        "encoder": [layer.self_attn for layer in model.encoder.layers],
        "decoder": [layer.self_attn for layer in model.decoder.layers],
        "cross": [layer.encoder_attn for layer in model.decoder.layers],
    }
    return [m for modules in chains.values() for m in modules]


# variant -> (residual attention route on every chain or None, ADMIN residuals, fairseq's eager
# path forced)
EXPECTED = {
    "vanilla": (None, None, False),
    "vanilla_eager": (None, None, True),
    "realformer": ("eager", True, False),  # auto: eager on a machine without a measured rule
    "realformer_eager": ("eager", True, False),
    "realformer_concat": ("concat", True, False),
    "postln": (None, False, False),
    "admin": (None, True, False),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_variant_builds_the_model_it_claims(name, monkeypatch):
    residual, admin, eager = EXPECTED[name]
    bench = toy_bench(name)
    modules = attention_modules(bench.model)
    assert len(modules) == 3 * 2
    for m in modules:
        assert m.embed_dim == TOY["width"] and m.num_heads == TOY["heads"]
        if residual:
            assert isinstance(m, RealformerMultiheadAttention)
            assert m.residual_attention_mode == "mean"
            assert m.residual_attention_impl == residual
        else:
            assert type(m) is MultiheadAttention
    assert bench.model.encoder.layers[0].fc1.out_features == TOY["ffn"]
    residuals = [r.admin for r in bench.model.modules() if isinstance(r, AdminResidual)]
    if admin is None:  # fairseq's own layers
        assert residuals == []
    else:
        assert residuals == [admin] * (2 * 2 + 3 * 2)
    # the training step's attention: fairseq's fused function, or not
    fused_calls = []
    real = torch.nn.functional.multi_head_attention_forward
    monkeypatch.setattr(
        torch.nn.functional,
        "multi_head_attention_forward",
        lambda *a, **k: fused_calls.append(1) or real(*a, **k),
    )
    sample = make_batch(bench.dictionary, 2, TOY["src_len"], TOY["tgt_len"], seed=1)
    bench.train_step(sample)
    assert bool(fused_calls) is (not residual and not eager)


def test_persistent_bytes_are_what_the_model_and_adam_hold():
    """Weights and Adam's two float32 moments, counted from the tensors after a training step
    (float32: half precision is fairseq's own Trainer, not this benchmark's loop)."""
    bench = toy_bench("realformer")
    sample = make_batch(bench.dictionary, 2, TOY["src_len"], TOY["tgt_len"], seed=1)
    bench.train_step(sample)
    held = {id(p): p for p in bench.model.parameters()}
    for p in bench.model.parameters():
        state = bench.optimizer.state[p]
        for key in ("exp_avg", "exp_avg_sq"):
            assert state[key].dtype == torch.float32
            held[id(state[key])] = state[key]
    with pytest.raises(ValueError, match="fairseq's Trainer with --fp16/--bf16"):
        toy_bench("realformer", torch.bfloat16)
    assert bench.persistent_bytes == sum(t.numel() * t.element_size() for t in held.values())


# ---------------------------------------------------------------------------
# the measurement


def test_repeats_interleave_and_reverse_the_order():
    calls = []
    steps = {name: (lambda n=name: calls.append(n)) for name in ("a", "b", "c")}
    rates = bench_measure.interleaved_rates(steps, {"a": 1, "b": 1, "c": 1}, repeats=3, calls=2)
    assert "".join(calls) == "aabbcc" "ccbbaa" "aabbcc"
    assert all(len(r) == 3 and all(x > 0 for x in r) for r in rates.values())


def test_ratio_is_the_median_of_per_repeat_ratios():
    rates = {"realformer": [2.0, 4.0, 9.0], "vanilla": [1.0, 1.0, 3.0]}
    ratio = bench_measure.ratio_of_rates(rates, "realformer", "vanilla")
    assert ratio == {"median": 3.0, "per_repeat": [2.0, 4.0, 3.0]}  # not 15 / 5


def test_cpu_peak_counts_the_tensors_alive_at_once():
    mib = 2**20

    def one_after_the_other():
        for _ in range(3):
            torch.empty(mib // 4, dtype=torch.float32).fill_(1.0)  # 1 MiB, freed at once

    def three_alive():
        kept = [torch.empty(mib // 4, dtype=torch.float32).fill_(1.0) for _ in range(3)]
        return len(kept)

    assert mib <= bench_measure.peak_bytes(one_after_the_other) < 1.1 * mib
    assert 3 * mib <= bench_measure.peak_bytes(three_alive) < 3.1 * mib


def test_targets_are_marked_by_their_direction():
    """Throughput must reach its target, memory must stay below: ✓/✗ accordingly."""

    def entry(train, memory, gen):
        return {"train_wps": train, "peak_memory": memory, "forward_peak_memory": 1.0,
                "gen_sents_per_s": gen}  # fmt: skip

    report = {
        "configs": {
            "deep": {
                "config": {"label": "L"},
                "ratios": {
                    "realformer/vanilla": entry(0.969, 1.16, 0.95),
                    "vanilla_eager/vanilla": entry(0.5, 2.0, 0.5),  # no targets on other rows
                },
                "variants": {},
            }
        }
    }
    rows = benchmark_speed.format_tables(report).split("\n\n")[0].splitlines()[2:]
    assert rows == [
        "| deep (L) | realformer/vanilla | 0.969 ✗ | 1.160 ✗ | 1.000 | 0.950 ✓ |",
        "| deep (L) | vanilla_eager/vanilla | 0.500 | 2.000 | 1.000 | 0.500 |",
    ]
    report["configs"]["deep"]["ratios"]["realformer/vanilla"] = entry(0.97, 1.15, 0.949)
    row = benchmark_speed.format_tables(report).splitlines()[2]
    assert row == "| deep (L) | realformer/vanilla | 0.970 ✓ | 1.150 ✓ | 1.000 | 0.949 ✗ |"


def test_bad_arguments_are_argparse_errors(capsys):
    for argv, message in (
        (["--repeats", "0"], "--repeats, --train-steps and --gen-batches must be >= 1"),
        (["--variants", "realformer"], "--variants must include vanilla (the baseline)"),
    ):
        with pytest.raises(SystemExit) as err:
            benchmark_speed.parse_args(argv)
        assert err.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)


# ---------------------------------------------------------------------------
# the command end to end (toy size)


@pytest.mark.slow
def test_benchmark_speed_toy_run_writes_its_report(tmp_path):
    out = tmp_path / "speed.json"
    stdout = run(
        [sys.executable, "-m", "studies.benchmark_speed", "--configs", "toy", "--repeats", "2",
         "--train-steps", "1", "--json", out],
        timeout=300,
    )  # fmt: skip
    assert "| config | ratio |" in stdout
    report = json.loads(out.read_text())
    assert report["machine"]["torch_threads"] == 1
    res = report["configs"]["toy"]
    assert res["config"]["label"] == "2L-2L d32 ffn64 h2, length 8"
    assert set(res["variants"]) == set(bench_models.VARIANTS)
    for key, entry in res["ratios"].items():
        a, b = key.split("/")
        per_repeat = [x / y for x, y in zip(res["variants"][a]["train_wps"],
                                            res["variants"][b]["train_wps"])]  # fmt: skip
        assert math.isclose(
            entry["train_wps"], sorted(per_repeat)[0] / 2 + sorted(per_repeat)[1] / 2
        )
