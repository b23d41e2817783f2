"""The models that the speed benchmarks measure, and their batches.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Understanding the Difficulty of Training Transformers" (arXiv 2004.08249).

Every model is built in this process through fairseq's own argument parsing of a registered
``--arch`` (fairseq's ``transformer``, the plugin's ``realformer_transformer``,
``postln_transformer_*``, ``admin_transformer_*``) with every size given explicitly, on a dummy
dictionary. Used by ``studies.benchmark_speed`` (CPU, float32); ``studies.gpu_check`` times
fairseq's own Trainer on the same variants (``studies.bench_trainer``).
"""

from pathlib import Path
from typing import Dict, NamedTuple, Sequence

import torch


class Variant(NamedTuple):
    """One model of the benchmarks: a registered ``--arch``, extra command-line flags (after
    the sizes, so they win), and whether fairseq's attention is forced onto its eager path."""

    arch: str
    flags: Sequence[str] = ()
    eager: bool = False


# the three routes of the residual score chains (--residual-attention-impl); "realformer" is
# the default, auto
IMPL_EAGER = ("--residual-attention-impl", "eager")
IMPL_CONCAT = ("--residual-attention-impl", "concat")
IMPL_TRITON = ("--residual-attention-impl", "triton")

VARIANTS = {
    "vanilla": Variant("transformer"),
    "vanilla_eager": Variant("transformer", eager=True),
    "realformer": Variant("realformer_transformer"),
    "realformer_eager": Variant("realformer_transformer", IMPL_EAGER),
    "realformer_concat": Variant("realformer_transformer", IMPL_CONCAT),
    "postln": Variant("postln_transformer_tiny"),
    "admin": Variant("admin_transformer_tiny"),
}
# variants that need an optional extra (triton: pip install -e '.[triton]'), so not in the CPU
# benchmark's default set; studies.gpu_check measures them where the extra is installed
OPTIONAL_VARIANTS = {
    "realformer_triton": Variant("realformer_transformer", IMPL_TRITON),
}


def quiet_route_logs():
    """No per-module kernel lines of the residual attention routes in a benchmark's output:
    fairseq's ``wav2vec2_classification`` sets the root logger to DEBUG on import."""
    import logging

    for route in ("routes.concat", "routes.triton_route"):
        logging.getLogger(f"realformer_fairseq.modules.{route}").setLevel(logging.INFO)


def dummy_dictionary(vocab: int):
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    return dictionary


def build(arch: str, sizes: Dict, dictionary, seed: int = 1, flags: Sequence[str] = ()):
    """Model and criterion from fairseq's own argument parsing of ``--arch arch`` (the
    command line is :func:`train_argv`)."""
    from fairseq import options
    from fairseq.tasks.translation import TranslationTask

    parser = options.get_training_parser(default_task="translation")
    args = options.parse_args_and_arch(parser, input_args=train_argv(arch, sizes, seed, flags))
    task = TranslationTask(args, dictionary, dictionary)
    torch.manual_seed(seed)
    return task.build_model(args), task.build_criterion(args)


def train_argv(arch: str, sizes: Dict, seed: int = 1, flags: Sequence[str] = ()):
    """The fairseq-train arguments of a benchmark model: every size explicit, then ``flags``."""
    import realformer_fairseq

    user_dir = str(Path(realformer_fairseq.__file__).resolve().parent)
    return [
        "unused-data-dir", "--user-dir", user_dir, "--task", "translation", "--arch", arch,
        "--encoder-layers", str(sizes["enc_layers"]), "--decoder-layers", str(sizes["dec_layers"]),
        "--encoder-embed-dim", str(sizes["width"]), "--decoder-embed-dim", str(sizes["width"]),
        "--encoder-ffn-embed-dim", str(sizes["ffn"]), "--decoder-ffn-embed-dim", str(sizes["ffn"]),
        "--encoder-attention-heads", str(sizes["heads"]),
        "--decoder-attention-heads", str(sizes["heads"]),
        "--share-all-embeddings", "--dropout", "0.1",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--seed", str(seed),
        "--max-source-positions", "1024", "--max-target-positions", "1024", *flags,
    ]  # fmt: skip


def force_eager_attention(model):
    """Every fairseq ``MultiheadAttention`` on fairseq's own bmm/softmax path, as the
    residual module is, instead of ``F.multi_head_attention_forward``."""
    from fairseq.modules import MultiheadAttention

    modules = [m for m in model.modules() if isinstance(m, MultiheadAttention)]
    if not modules:
        raise RuntimeError("no MultiheadAttention to force onto the eager path")
    for module in modules:
        module._set_skip_embed_dim_check()
    return model


def make_batch(
    dictionary, bsz: int, src_len: int, tgt_len: int, seed: int, device: str = "cpu"
) -> Dict:
    """Random tokens; sources left-padded to lengths in [0.75, 1] x src_len."""
    g = torch.Generator().manual_seed(seed)
    low, high = dictionary.nspecial, len(dictionary)
    lengths = torch.randint(max(2, int(0.75 * src_len)), src_len + 1, (bsz,), generator=g)
    lengths[0] = src_len
    src = torch.full((bsz, src_len), dictionary.pad(), dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        src[i, src_len - n :] = torch.randint(low, high, (n,), generator=g)
        src[i, -1] = dictionary.eos()
    tgt = torch.randint(low, high, (bsz, tgt_len), generator=g)
    tgt[:, -1] = dictionary.eos()
    prev = torch.cat([torch.full((bsz, 1), dictionary.eos()), tgt[:, :-1]], dim=1)
    return {
        "id": torch.arange(bsz, device=device),
        "nsentences": bsz,
        "ntokens": int(tgt.numel()),
        "net_input": {
            "src_tokens": src.to(device),
            "src_lengths": lengths.to(device),
            "prev_output_tokens": prev.to(device),
        },
        "target": tgt.to(device),
    }


class Bench:
    """One variant on the CPU benchmark (``studies.benchmark_speed``), in float32: model,
    criterion, Adam, beam-search generator. Half precision is fairseq's own step
    (``studies.bench_trainer``: ``Trainer.train_step`` with the optimizer ``--fp16`` /
    ``--bf16`` build), not a loop of ours."""

    def __init__(
        self, name: str, sizes: Dict, dictionary, beam: int = 5, device: str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):  # fmt: skip
        if dtype != torch.float32:
            raise ValueError(
                f"Bench runs float32; {dtype} is fairseq's Trainer with --fp16/--bf16 "
                "(studies.bench_trainer.TrainerBench)"
            )
        variant = {**VARIANTS, **OPTIONAL_VARIANTS}[name]
        self.name, self.arch, self.flags = name, variant.arch, tuple(variant.flags)
        self.model, self.criterion = build(self.arch, sizes, dictionary, flags=self.flags)
        if variant.eager:
            force_eager_attention(self.model)
        self.model.to(device=device)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.param_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-5, foreach=False)
        # weights and Adam's two float32 moments
        self.persistent_bytes = self.param_bytes + 2 * 4 * self.params
        self.dictionary, self.beam, self.generators = dictionary, beam, {}

    def train_step(self, sample):
        self.model.train()
        loss, _, _ = self.criterion(self.model, sample)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def generate(self, sample, length: int):
        """Beam search with the output length pinned to ``length`` (``min_len = max_len``), so
        that every variant decodes the same number of steps, even with random weights."""
        from fairseq.sequence_generator import SequenceGenerator

        if length not in self.generators:
            self.generators[length] = SequenceGenerator(
                [self.model], self.dictionary, beam_size=self.beam, max_len_a=0,
                max_len_b=length, min_len=length,
            )  # fmt: skip
        self.model.eval()
        hypos = self.generators[length].generate([self.model], sample)
        if {len(h[0]["tokens"]) for h in hypos} != {length + 1}:
            raise RuntimeError(f"{self.name}: generated length is not the pinned {length}")
        return hypos
