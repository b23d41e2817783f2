"""Reliability of the plugin: one-line start-up errors and finite numerics.

Start-up errors are checked through the real console scripts (``fairseq-train``,
``fairseq-generate``): the process must exit non-zero with exactly one line
``realformer_fairseq: error: ...`` and no Python traceback. Numerics are checked
in-process on models built from the registered architectures: no NaN/inf in the
outputs, the float32 residual score streams, or the gradients, for fully padded
rows, length-1 and 1024-token sequences and a 60-layer chain in bf16/fp16.
"""

import argparse
import os
import subprocess
from pathlib import Path

import harness
import pytest
import torch

from realformer_fairseq.checkpoint_compat import fairseq_checkpoint_globals
from realformer_fairseq.errors import RealformerConfigError
from realformer_fairseq.modules.realformer_layer import (
    RealformerEncoderLayer,
    check_chain_heads,
    realformer_config,
)
from realformer_fairseq.modules.routes import RealformerMultiheadAttention
from realformer_fairseq.settings import read_realformer_settings

ERROR_PREFIX = "realformer_fairseq: error: "


# ---------------------------------------------------------------- helpers


def run_failing(cmd, timeout=300) -> str:
    """Run a command that must fail at start-up; return its one error line."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(
        [str(c) for c in cmd],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    out = proc.stdout
    assert proc.returncode != 0, f"expected a start-up error, got rc=0:\n{out[-3000:]}"
    assert "Traceback" not in out, f"stack trace instead of one error line:\n{out[-4000:]}"
    lines = [line for line in out.splitlines() if line.startswith(ERROR_PREFIX)]
    assert len(lines) == 1, f"expected one '{ERROR_PREFIX}' line, got {lines}:\n{out[-3000:]}"
    return lines[0]


def train_cmd(data_bin: Path, save_dir: Path, *extra) -> list:
    return [
        harness.fairseq_command("fairseq-train"),
        data_bin,
        "--user-dir",
        harness.USER_DIR,
        "--task",
        "translation",
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--max-tokens",
        "2000",
        "--max-update",
        "1",
        "--save-dir",
        save_dir,
        "--no-epoch-checkpoints",
        "--num-workers",
        "0",
        "--log-format",
        "simple",
        "--cpu",
        *extra,
    ]


def arch_args(arch: str = "realformer_tiny", **overrides) -> argparse.Namespace:
    """Model args as fairseq's argument parsing leaves them for ``--arch``."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = argparse.Namespace(arch=arch, _name=arch, **overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def build_model(arch: str = "realformer_tiny", **overrides):
    """A registered translation model built in-process on a toy dictionary."""
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    dictionary = harness.toy_dictionary()
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    model = ARCH_MODEL_REGISTRY[arch].build_model(arch_args(arch, **overrides), task)
    return model, dictionary


def tokens(dictionary, bsz: int, length: int, seed: int = 0, bos_eos: str = "src"):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(dictionary.nspecial, len(dictionary), (bsz, length), generator=g)
    if bos_eos == "src":
        t[:, -1] = dictionary.eos()
    else:
        t[:, 0] = dictionary.eos()  # prev_output_tokens start with EOS
    return t


def forward_backward(model, dictionary, src, prev):
    """Train-mode forward (ADMIN profiles on the first call) and backward of
    the sum of all logits; returns (logits, score streams seen with grad)."""
    model.train()
    streams = []

    def keep(module, inputs, output):
        if output[2].requires_grad:  # not the ADMIN profiling pass (no_grad)
            output[2].retain_grad()
            streams.append(output[2])

    hooks = [
        m.register_forward_hook(keep)
        for m in model.modules()
        if isinstance(m, RealformerMultiheadAttention)
    ]
    try:
        src_lengths = src.ne(dictionary.pad()).sum(1)
        logits, _ = model(src, src_lengths, prev)
        # every logit, padded rows included: their gradients must be finite too
        logits.float().sum().backward()
    finally:
        for h in hooks:
            h.remove()
    return logits, streams


def assert_all_finite(model, logits, streams, n_streams):
    assert torch.isfinite(logits).all(), "non-finite logits"
    assert len(streams) == n_streams, f"expected {n_streams} residual score streams"
    for s in streams:
        assert s.dtype == torch.float32, f"score stream in {s.dtype}, not float32"
        assert torch.isfinite(s).all(), "non-finite residual attention scores"
        assert s.grad is not None and torch.isfinite(s.grad).all(), "non-finite score gradient"
    grads = [(n, p.grad) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, g in grads if g is None]
    assert not missing, f"parameters without gradient: {missing[:3]}"
    bad = [n for n, g in grads if not torch.isfinite(g).all()]
    assert not bad, f"non-finite gradients in {bad[:3]}"


# ----------------------------------------------------- one-line start-up errors


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("reliability")
    raw = harness.make_multi30k_subset(root / "raw", n_train=120, n_valid=16, n_test=8)
    return harness.preprocess(raw, root / "data-bin")


@pytest.mark.parametrize(
    "flags, expected",
    [
        (
            ["--arch", "preln_transformer_tiny", "--init-type", "admin"],
            "--init-type admin is for Post-LN models",
        ),
        (
            ["--arch", "realformer_tiny", "--residual-attention", "none"]
            + ["--residual-attention-mode", "mean"],
            "--residual-attention-mode mean needs residual attention on",
        ),
        (
            ["--arch", "realformer_tiny", "--residual-attention", "encoder,bogus"],
            "unknown chain(s) ['bogus']",
        ),
        (
            # used to turn residual attention off without a word (the build line said 0/2)
            ["--arch", "realformer_tiny", "--residual-attention", ""],
            "--residual-attention '': no chain named",
        ),
    ],
    ids=["admin-with-pre-ln", "mode-without-chain", "unknown-chain", "empty-chain-list"],
)
def test_bad_flags_give_one_error_line(data_bin, tmp_path, flags, expected):
    line = run_failing(train_cmd(data_bin, tmp_path / "ckpt", *flags))
    assert expected in line, line
    assert not (tmp_path / "ckpt" / "checkpoint_last.pt").exists()


def test_admin_allow_pre_ln_accepts_pre_ln():
    model, _ = build_model("preln_transformer_tiny", init_type="admin", admin_allow_pre_ln=True)
    assert model.admin_init_type == "admin"
    assert model.encoder.layers[0].normalize_before
    with pytest.raises(RealformerConfigError, match="is for Post-LN models"):
        build_model("preln_transformer_tiny", init_type="admin")


@pytest.fixture(scope="module")
def realformer_checkpoint(data_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("realformer-ckpt")
    harness.train_translation(data_bin, save_dir, arch="realformer_tiny", max_update=1)
    return save_dir / "checkpoint_last.pt"


def test_restore_into_other_arch_gives_one_error_line(data_bin, realformer_checkpoint, tmp_path):
    cmd = train_cmd(
        data_bin,
        tmp_path / "ckpt",
        "--arch",
        "postln_transformer_tiny",
        "--restore-file",
        realformer_checkpoint,
    )
    line = run_failing(cmd)
    assert "--arch realformer_tiny" in line and "--arch postln_transformer_tiny" in line, line
    assert "unexpected keys (e.g. encoder.layers.0.self_attn_residual.omega" in line, line


def test_generate_with_mismatching_overrides_gives_one_error_line(data_bin, realformer_checkpoint):
    cmd = [
        harness.fairseq_command("fairseq-generate"),
        data_bin,
        "--user-dir",
        harness.USER_DIR,
        "--path",
        realformer_checkpoint,
        "--gen-subset",
        "test",
        "--batch-size",
        "8",
        "--num-workers",
        "0",
        "--cpu",
        "--model-overrides",
        "{'encoder_layers': 3}",
    ]
    line = run_failing(cmd)
    assert "with other flags" in line and "missing keys (e.g. encoder.layers.2." in line, line


def test_load_state_dict_of_other_arch_raises_config_error_in_process():
    realformer, _ = build_model("realformer_tiny")
    postln, _ = build_model("postln_transformer_tiny")
    with pytest.raises(RealformerConfigError) as err:
        postln.load_state_dict(realformer.state_dict())
    assert "\n" not in str(err.value)
    assert "--arch realformer_tiny" in str(err.value)
    # a fitting state dict still loads, and the arch travels in its metadata
    other, _ = build_model("realformer_tiny")
    other.load_state_dict(realformer.state_dict())
    assert realformer.state_dict()._metadata[""]["realformer_arch"] == "realformer_tiny"


def test_chain_with_different_head_counts_is_refused():
    """fairseq's flags give one head count per stack, so such a chain can only
    be built in-process: check_chain_heads refuses it at construction, and the
    attention module refuses a stream of the wrong shape at run time."""
    model, _ = build_model("realformer_tiny")
    layers = model.encoder.layers
    check_chain_heads(layers, "self_attn", "encoder")  # 2 and 2 heads: fine
    layers.append(
        RealformerEncoderLayer(
            realformer_config(
                arch_args("realformer_tiny", encoder_attention_heads=4),
                read_realformer_settings(arch_args("realformer_tiny")),
            )
        )
    )
    with pytest.raises(RealformerConfigError, match=r"chain 'encoder'.*\[2, 2, 4\]"):
        check_chain_heads(layers, "self_attn", "encoder")

    two = RealformerMultiheadAttention(16, 2, residual_attention_mode="sum", self_attention=True)
    four = RealformerMultiheadAttention(16, 4, residual_attention_mode="sum", self_attention=True)
    x = torch.randn(5, 3, 16)  # (seq_len, bsz, embed_dim)
    _, _, scores, _, _ = two(x, x, x, prev_attn_scores=None, layer_idx=0)  # (3*2, 5, 5)
    with pytest.raises(ValueError, match="residual attention chain mismatch"):
        four(x, x, x, prev_attn_scores=scores, layer_idx=1)


# ----------------------------------------------------------------- numerics

# realformer_tiny: 2+2 layers, three chains -> 2 (enc) + 2 (dec self) + 2 (cross) streams
TINY_STREAMS = 6


def test_fully_padded_rows_stay_finite():
    """A batch row that is all padding, in the source and in the target: its
    keys are all masked, so its softmax rows must be uniform, not NaN."""
    torch.manual_seed(0)
    model, d = build_model("realformer_tiny", dropout=0.0)
    src = tokens(d, 3, 7, seed=1)
    prev = tokens(d, 3, 6, seed=2, bos_eos="tgt")
    src[1] = d.pad()  # fully padded source row
    prev[2] = d.pad()  # fully padded target row
    src[0, :3] = d.pad()  # and an ordinary left-padded row
    logits, streams = forward_backward(model, d, src, prev)
    assert_all_finite(model, logits, streams, TINY_STREAMS)


def test_length_one_sequences_stay_finite():
    torch.manual_seed(0)
    model, d = build_model("realformer_tiny")
    src = tokens(d, 2, 1, seed=1)  # just EOS
    prev = tokens(d, 2, 1, seed=2, bos_eos="tgt")  # just EOS
    logits, streams = forward_backward(model, d, src, prev)
    assert logits.shape[:2] == (2, 1)
    assert_all_finite(model, logits, streams, TINY_STREAMS)


def test_1024_token_sequences_stay_finite():
    torch.manual_seed(0)
    model, d = build_model(
        "realformer_tiny",
        encoder_embed_dim=16,
        encoder_ffn_embed_dim=32,
        encoder_layers=2,
        decoder_layers=1,
    )
    src = tokens(d, 1, 1024, seed=1)
    prev = tokens(d, 1, 1024, seed=2, bos_eos="tgt")
    logits, streams = forward_backward(model, d, src, prev)
    assert streams[0].shape == (2, 1024, 1024)  # (bsz*heads, src_len, src_len)
    assert_all_finite(model, logits, streams, 2 + 1 + 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_60_layer_chain_in_half_precision(dtype):
    """The paper's 60-layer encoder, at tiny width, run in bf16/fp16 on CPU
    (forward, ADMIN profiling and backward): finite, with float32 streams."""
    torch.manual_seed(0)
    model, d = build_model("realformer_tiny", encoder_layers=60, decoder_layers=2)
    model = model.to(dtype)
    src = tokens(d, 2, 12, seed=1)
    src[1, :4] = d.pad()
    prev = tokens(d, 2, 10, seed=2, bos_eos="tgt")
    logits, streams = forward_backward(model, d, src, prev)
    assert logits.dtype == dtype
    assert bool(model.admin_profiled)
    omegas = [float(m.omega_init) for n, m in model.named_modules() if n.endswith("_residual")]
    assert all(o >= 1.0 for o in omegas) and max(omegas) > 3.0  # profiled, growing with depth
    assert_all_finite(model, logits, streams, 60 + 2 + 2)


def test_half_precision_stream_is_accumulated_in_float32():
    """60 fp16 layers whose raw scores are ~2000 each: the running sum
    (~120000) is beyond fp16's range (65504) but the float32 stream holds it."""
    torch.manual_seed(0)
    embed_dim, heads, n_layers = 16, 2, 60
    head_dim = embed_dim // heads
    scale = (2000.0 * head_dim**0.5 / head_dim) ** 0.5  # q.k / sqrt(d) = 2000 for x = 1
    layers = []
    for _ in range(n_layers):
        m = RealformerMultiheadAttention(
            embed_dim, heads, residual_attention_mode="sum", self_attention=True
        )
        with torch.no_grad():
            for proj in (m.q_proj, m.k_proj):
                proj.weight.copy_(torch.eye(embed_dim) * scale)
                proj.bias.zero_()
        layers.append(m.half())
    x = torch.ones(4, 1, embed_dim, dtype=torch.float16, requires_grad=True)  # (T, B, C)
    scores = None
    for idx, layer in enumerate(layers):
        out, _, scores, _, _ = layer(x, x, x, prev_attn_scores=scores, layer_idx=idx)
        assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert scores.dtype == torch.float32
    assert torch.isfinite(scores).all()
    expected = n_layers * 2000.0
    assert expected > torch.finfo(torch.float16).max
    torch.testing.assert_close(scores, torch.full_like(scores, expected), rtol=2e-3, atol=0)
    (out.float().sum() + scores.sum() * 1e-6).backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(["--fp16", "--fp16-no-flatten-grads"], id="fp16"),
        pytest.param(
            ["--memory-efficient-fp16"], id="memory-efficient-fp16", marks=pytest.mark.slow
        ),
    ],
)
def test_fp16_training_on_cpu(data_bin, tmp_path, flags):
    """fairseq-train in fp16 on CPU (fairseq's flat fp32 master copy asks for a
    CUDA device, so --fp16 needs --fp16-no-flatten-grads there): ADMIN profiles
    in half precision, no gradient overflow, the loss goes down, and omega_init
    (a buffer, outside the optimizer's fp32 copies) keeps the profiled value."""
    log = harness.train_translation(
        data_bin, tmp_path, arch="realformer_tiny", max_update=4, extra=flags
    )
    assert log.count("ADMIN profiling done") == 1
    assert "gradient overflow" not in log and "Minimum loss scale reached" not in log
    losses = harness.parse_train_losses(log)
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    with torch.serialization.safe_globals(fairseq_checkpoint_globals()):
        state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu")["model"]
    omegas = [float(v) for k, v in state.items() if k.endswith("omega_init")]
    assert len(omegas) == 10 and max(omegas) > 1.1
    deltas = [v for k, v in state.items() if k.endswith("omega_delta")]
    assert all(torch.isfinite(d).all() for d in deltas) and any(d.abs().max() > 0 for d in deltas)
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
