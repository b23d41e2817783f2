"""The input embeddings of the decoder-only RealFormer LM (``realformer_lm``, He et al. 2020,
arXiv 2012.11747) that its re-owned ``build_model`` builds itself, as fairseq 0.12's
``TransformerLanguageModel.build_model`` does: character embeddings (``--character-embeddings``)
and adaptive input (``--adaptive-input``, with adaptive softmax and tied weights).

Each case builds fairseq's own ``transformer_lm`` and the plugin's ``realformer_lm`` (residual
attention off, default init) from the same command line, the way ``fairseq-train`` does
(``parse_args_and_arch``, ``convert_namespace_to_omegaconf``, ``task.build_model(cfg.model)``),
with the same seed: the weights must be the same tensors under the same names, and the outputs
and log-probabilities of a training forward must be equal."""

import pytest
import torch
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.modules import AdaptiveInput, CharacterTokenEmbedder
from fairseq.tasks.language_modeling import LanguageModelingTask
from harness import NO_DROPOUT_FLAGS, USER_DIR, toy_dictionary

from realformer_fairseq.models.realformer_lm import RealformerLanguageModel

SIZES = [
    "--decoder-layers", "2", "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "128",
    "--decoder-attention-heads", "2",
    # fairseq's transformer_lm takes these from its dataclass (512), whatever the width
    "--decoder-input-dim", "64", "--decoder-output-dim", "64",
]  # fmt: skip
ADAPTIVE_INPUT = ["--adaptive-input", "--adaptive-input-cutoff", "10,30"]
CASES = {
    "character-embeddings": ["--character-embeddings"],
    "character-embeddings, small filters": [
        "--character-embeddings", "--character-filters", "[(1, 8), (2, 16)]",
        "--character-embedding-dim", "6", "--char-embedder-highway-layers", "1",
    ],  # fmt: skip
    "adaptive-input": [*ADAPTIVE_INPUT, "--adaptive-input-factor", "2"],
    "adaptive-input, adaptive softmax, tied weights and projections": [
        *ADAPTIVE_INPUT, "--adaptive-softmax-cutoff", "10,30", "--tie-adaptive-weights",
        "--tie-adaptive-proj", "--criterion", "adaptive_loss",
    ],  # fmt: skip
}
EMBEDDER = {"character": CharacterTokenEmbedder, "adaptive": AdaptiveInput}


def build_as_fairseq_train(arch: str, flags, seed: int = 7):
    """The model fairseq-train builds for this command line (before any data is read)."""
    argv = ["unused-data", "--user-dir", USER_DIR, "--task", "language_modeling"]
    argv += ["--arch", arch, "--tokens-per-sample", "16", "--seed", str(seed)]
    argv += [*SIZES, *NO_DROPOUT_FLAGS, *flags]
    parser = options.get_training_parser(default_task="language_modeling")
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, input_args=argv))
    dictionary = toy_dictionary()
    task = LanguageModelingTask(cfg.task, dictionary, dictionary)
    torch.manual_seed(seed)
    return task.build_model(cfg.model), dictionary


@pytest.mark.parametrize("case", sorted(CASES))
def test_input_embeddings_equal_fairseqs_transformer_lm(case):
    flags = CASES[case]
    theirs, dictionary = build_as_fairseq_train("transformer_lm", flags)
    ours, _ = build_as_fairseq_train(
        "realformer_lm", [*flags, "--residual-attention", "none", "--init-type", "default"]
    )
    assert isinstance(ours, RealformerLanguageModel)
    embedder = EMBEDDER[case.split("-")[0]]
    assert type(ours.decoder.embed_tokens) is type(theirs.decoder.embed_tokens) is embedder

    their_state = theirs.state_dict()
    # _float_tensor: an uninitialised buffer of fairseq's embedders, never read
    their_state = {k: v for k, v in their_state.items() if not k.endswith("_float_tensor")}
    our_state = {k: v for k, v in ours.state_dict().items() if not k.endswith("_float_tensor")}
    our_state.pop("admin_profiled")
    assert sorted(our_state) == sorted(their_state)
    for name, value in their_state.items():
        assert torch.equal(our_state[name], value), name  # same seed, same initial weights

    tied = "--tie-adaptive-weights" in flags
    assert (ours.decoder.adaptive_softmax is not None) is tied
    if tied:  # the tails are the adaptive input's own tensors, as in fairseq
        for i, tail in enumerate(ours.decoder.adaptive_softmax.tail):
            assert tail[-1].weight is ours.decoder.embed_tokens.embeddings[i + 1][0].weight
            assert tail[0].weight is ours.decoder.embed_tokens.embeddings[i + 1][1].weight

    tokens = torch.randint(4, len(dictionary), (3, 12), generator=torch.Generator().manual_seed(0))
    tokens[1, 9:] = dictionary.pad()
    ours.train(), theirs.train()  # no dropout: train mode exercises the training path
    our_out, their_out = ours(tokens), theirs(tokens)
    assert torch.equal(our_out[0], their_out[0])
    our_lprobs = ours.get_normalized_probs(our_out, log_probs=True)
    their_lprobs = theirs.get_normalized_probs(their_out, log_probs=True)
    assert our_lprobs.shape == (3, 12, len(dictionary))
    assert torch.equal(our_lprobs, their_lprobs)
