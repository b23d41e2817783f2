"""fairseq's own training step, built from the flags a user types, for the GPU check's rows.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Very Deep Transformers for Neural Machine Translation" (arXiv 2008.07772).

A :class:`TrainerBench` is ``fairseq.trainer.Trainer`` on a model, criterion and task parsed
from a ``fairseq-train`` command line (``--fp16``: ``FP16Optimizer`` over one flattened float32
copy of the parameters; ``--bf16``: the same optimizer, not flattened, as fairseq decides;
``--memory-efficient-fp16``: ``MemoryEfficientFP16Optimizer``); its step is ``Trainer.train_step``
on a list of one sample, as ``fairseq_cli.train`` calls it. Batches are fairseq's own: sentence
pairs collated by ``language_pair_dataset.collate`` after ``data_utils.batch_by_size`` at a
``--max-tokens``, with lengths drawn from a real corpus' length histogram; or full unpadded
blocks for a masked LM, 15 % of positions masked.
"""

import functools
import random
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

# what one timed call runs: fairseq's training step (its qualified name goes into every row)
STEP_FUNCTION = "fairseq.trainer.Trainer.train_step"

# the fairseq-train precision flags of each dtype a row names
PRECISION_FLAGS = {
    "fp32": (),
    "fp16": ("--fp16",),
    "bf16": ("--bf16",),
    "memory_efficient_fp16": ("--fp16", "--memory-efficient-fp16"),
}
# fairseq's flattened float32 copy (FP16Optimizer.build_fp32_params) is made on
# torch.cuda.current_device(): on CPU the smoke run keeps the per-parameter copies
CPU_PRECISION_FLAGS = ("--fp16-no-flatten-grads",)

MASK_PROB = 0.15  # fairseq's masked_lm default


def step_function_name() -> str:
    """The qualified name of the function a timed call runs, read from fairseq itself."""
    from fairseq.trainer import Trainer

    fn = Trainer.train_step
    return f"{Trainer.__module__}.{fn.__qualname__}"


def dictionary_for(task: str, vocab: int):
    """A dummy dictionary of ``vocab`` symbols; a masked LM's ``<mask>`` added once, before any
    model is built, so that every variant of a case has the same vocabulary."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    if task == "masked_lm":
        dictionary.add_symbol("<mask>")
    return dictionary


def trainer_argv(
    task: str, arch: str, sizes: Dict, dtype: str, max_positions: int, device: str,
    flags: Sequence[str] = (), seed: int = 1,
) -> List[str]:  # fmt: skip
    """The ``fairseq-train`` arguments of one model of a case: every size explicit, the
    precision flags of ``dtype``, the recipe's optimizer, then ``flags`` (a route)."""
    import realformer_fairseq

    user_dir = str(Path(realformer_fairseq.__file__).resolve().parent)
    argv = ["unused-data-dir", "--user-dir", user_dir, "--task", task, "--arch", arch]
    if task == "translation":
        argv += [
            "--encoder-layers", str(sizes["enc_layers"]), "--decoder-layers", str(sizes["dec_layers"]),
            "--encoder-embed-dim", str(sizes["width"]), "--decoder-embed-dim", str(sizes["width"]),
            "--encoder-ffn-embed-dim", str(sizes["ffn"]), "--decoder-ffn-embed-dim", str(sizes["ffn"]),
            "--encoder-attention-heads", str(sizes["heads"]),
            "--decoder-attention-heads", str(sizes["heads"]),
            "--share-all-embeddings", "--dropout", "0.1",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--max-source-positions", str(max_positions),
            "--max-target-positions", str(max_positions),
            "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
        ]  # fmt: skip
    elif task == "masked_lm":
        argv += [
            "--encoder-layers", str(sizes["enc_layers"]),
            "--encoder-embed-dim", str(sizes["width"]),
            "--encoder-ffn-embed-dim", str(sizes["ffn"]),
            "--encoder-attention-heads", str(sizes["heads"]),
            "--criterion", "masked_lm", "--tokens-per-sample", str(max_positions),
            "--max-positions", str(max_positions),
            "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-6", "--lr", "5e-4",
        ]  # fmt: skip
    else:
        raise ValueError(f"task must be translation or masked_lm, got {task!r}")
    argv += ["--optimizer", "adam", "--seed", str(seed), *PRECISION_FLAGS[dtype]]
    if device == "cpu":
        argv += ["--cpu", *(CPU_PRECISION_FLAGS if dtype != "fp32" else ())]
    return argv + list(flags)


class TrainerBench:
    """One model of a case: fairseq's ``Trainer`` built from ``argv`` as ``fairseq-train``
    builds it (task from the parsed config, model, criterion), on a dummy dictionary."""

    def __init__(self, name: str, task: str, argv: Sequence[str], dictionary, seed: int = 1):
        from fairseq import options
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf
        from fairseq.trainer import Trainer

        self.name, self.argv = name, list(argv)
        parser = options.get_training_parser(default_task=task)
        args = options.parse_args_and_arch(parser, input_args=self.argv)
        # fairseq 0.12's parse_args_and_arch turns --bf16 into --tpu (torch_xla): on a GPU or
        # CPU the step is the same Trainer with the TPU path off, said in the row
        self.overrides = []
        if args.bf16 and args.tpu and "--tpu" not in self.argv:
            args.tpu = False
            self.overrides.append("common.tpu=False (fairseq 0.12 sets it with --bf16)")
        cfg = convert_namespace_to_omegaconf(args)
        if task == "translation":
            from fairseq.tasks.translation import TranslationTask

            fairseq_task = TranslationTask(cfg.task, dictionary, dictionary)
        else:
            from fairseq.tasks.masked_lm import MaskedLMTask

            fairseq_task = MaskedLMTask(cfg.task, dictionary)
        torch.manual_seed(seed)
        model = fairseq_task.build_model(cfg.model)
        criterion = fairseq_task.build_criterion(cfg.criterion)
        self.cfg = cfg
        self.trainer = Trainer(cfg, fairseq_task, model, criterion)
        self.trainer.lr_step(0)  # builds the optimizer and its scheduler, as fairseq-train does

    @property
    def model(self):
        return self.trainer.model

    @property
    def optimizer_name(self) -> str:
        """The optimizer class the user's flags built (``FP16Optimizer``, ...)."""
        return type(self.trainer.optimizer).__name__

    @property
    def inner_optimizer_name(self) -> str:
        inner = getattr(self.trainer.optimizer, "fp32_optimizer", None)
        inner = getattr(inner, "optimizer", None) or getattr(
            getattr(self.trainer.optimizer, "wrapped_optimizer", None), "optimizer", None
        )
        inner = inner or self.trainer.optimizer.optimizer
        return type(inner).__name__

    @property
    def flattened(self) -> bool:
        """Whether the float32 master copy is one flat tensor (fairseq's ``--fp16``)."""
        return bool(getattr(self.trainer.optimizer, "has_flat_params", False))

    def train_step(self, sample) -> None:
        self.trainer.train_step([sample])

    def persistent_bytes(self) -> int:
        """Bytes of every tensor the step keeps between steps: the model's parameters and
        gradients, the optimizer's float32 copies, their gradients and Adam's moments."""
        held = {}

        def add(t):
            if torch.is_tensor(t):
                held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()

        for p in self.model.parameters():
            add(p.data)
            add(p.grad)
        optimizer = self.trainer.optimizer
        fp32 = getattr(optimizer, "fp32_params", None)
        copies = fp32.values() if isinstance(fp32, dict) else (fp32 or [])
        for p in copies:
            add(p.data)
            add(p.grad)
        for state in optimizer.optimizer.state.values():
            for t in state.values():
                add(t)
        return sum(held.values())


# ---------------------------------------------------------------------------
# batches


@functools.lru_cache(maxsize=None)
def corpus_lengths(pairs: Tuple[Tuple[Path, Path], ...]) -> List[Tuple[int, int]]:
    """(source, target) lengths of every line pair of the corpora: whitespace tokens (the
    files are Moses-tokenised) plus fairseq's end-of-sentence."""
    out = []
    for src_path, tgt_path in pairs:
        src = src_path.read_text(encoding="utf-8").splitlines()
        tgt = tgt_path.read_text(encoding="utf-8").splitlines()
        if len(src) != len(tgt):
            raise ValueError(f"{src_path} and {tgt_path} differ in lines: {len(src)}, {len(tgt)}")
        out += [(len(s.split()) + 1, len(t.split()) + 1) for s, t in zip(src, tgt)]
    return out


def translation_batches(
    dictionary, lengths: Sequence[Tuple[int, int]], max_tokens: int, batches: int, seed: int,
    scale: float = 1.0, max_length: Optional[int] = None,
) -> List[Dict]:  # fmt: skip
    """``batches`` of fairseq's own making: sentence pairs drawn from the length histogram
    ``lengths`` (each length times ``scale``, at most ``max_length``), ordered and cut at
    ``max_tokens`` by ``data_utils.batch_by_size`` (as ``--max-tokens``), collated by
    ``language_pair_dataset.collate`` (sources left-padded, targets right-padded), random
    tokens; the batches taken are drawn from all of them with ``seed``."""
    import numpy as np
    from fairseq.data import data_utils
    from fairseq.data.language_pair_dataset import collate

    rng = random.Random(seed)
    # enough sentences for several batches of every length
    pool = [rng.choice(lengths) for _ in range(max(64, 16 * batches * max_tokens // 24))]

    def fit(n):
        n = max(2, int(round(n * scale)))
        return min(n, max_length) if max_length else n

    pool = [(fit(s), fit(t)) for s, t in pool]
    sizes = np.array([max(s, t) for s, t in pool])
    order = np.lexsort(([t for _, t in pool], [s for s, _ in pool]))  # fairseq: by src, tgt
    all_batches = data_utils.batch_by_size(
        order, num_tokens_fn=lambda i: sizes[i], max_tokens=max_tokens
    )
    chosen = rng.sample(range(len(all_batches)), min(batches, len(all_batches)))
    g = torch.Generator().manual_seed(seed)
    low, high = dictionary.nspecial, len(dictionary)
    out = []
    for b in chosen:
        samples = []
        for i in all_batches[b]:
            s, t = pool[i]
            src = torch.randint(low, high, (s,), generator=g)
            tgt = torch.randint(low, high, (t,), generator=g)
            src[-1] = tgt[-1] = dictionary.eos()
            samples.append({"id": int(i), "source": src, "target": tgt})
        out.append(collate(samples, dictionary.pad(), dictionary.eos()))
    return out


def masked_lm_batch(dictionary, sequences: int, length: int, seed: int) -> Dict:
    """``sequences`` full blocks of ``length`` tokens, no padding (fairseq's
    ``--sample-break-mode none``): ``<s>`` first, 15 % of the positions replaced by ``<mask>``
    and predicted, the rest of the target padding."""
    g = torch.Generator().manual_seed(seed)
    low, high = dictionary.nspecial, dictionary.index("<mask>")
    tokens = torch.randint(low, high, (sequences, length), generator=g)
    tokens[:, 0] = dictionary.bos()
    masked = torch.rand((sequences, length), generator=g) < MASK_PROB
    masked[:, 0] = False
    masked[:, 1] = True  # at least one prediction per sequence
    target = torch.full_like(tokens, dictionary.pad())
    target[masked] = tokens[masked]
    src = tokens.masked_fill(masked, dictionary.index("<mask>"))
    return {
        "id": torch.arange(sequences),
        "nsentences": sequences,
        "ntokens": sequences * length,
        "net_input": {
            "src_tokens": src,
            "src_lengths": torch.full((sequences,), length, dtype=torch.long),
        },
        "target": target,
    }


def batch_tokens(batch: Dict) -> int:
    return int(batch["ntokens"])


# ---------------------------------------------------------------------------
# which SDPA kernel ran

# profiler names (ATen ops on CPU, CUDA kernels on a GPU) -> SDPA backend; first match wins
SDPA_PATTERNS = (
    ("cudnn", ("cudnn_attention", "cudnn_generated", "sdpa_cudnn", "cudnn_fmha", "fmha_cudnn")),
    ("flash", ("flash_attention", "flash_fwd", "flash_bwd", "flash::")),
    ("efficient", ("efficient_attention", "fmha_cutlass", "mem_efficient", "fmha_sm")),
    ("math", ("_scaled_dot_product_attention_math",)),
)


def sdpa_backend(names: Sequence[str], device: str) -> str:
    """The SDPA backends that the profiler's op and kernel ``names`` show ran: flash,
    efficient, cudnn or math (``/cpu`` on CPU), joined by ``+`` where a step ran several (one
    per chain kind); ``none`` when no SDPA ran (fairseq's bmm/softmax)."""
    lowered = [n.lower() for n in names]
    ran = [backend for backend, patterns in SDPA_PATTERNS
           if any(p in n for n in lowered for p in patterns)]  # fmt: skip
    if not ran:
        return "none"
    return "+".join(ran if device.startswith("cuda") else [f"{b}/cpu" for b in ran])


def profiled_names(fn, device: str) -> List[str]:
    """Names of the ops and kernels that ``fn`` ran, from ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        fn()
    return sorted({e.name for e in prof.events()})
