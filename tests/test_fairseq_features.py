"""fairseq 0.12.3's own generation and training features on the plugin's models, beside
fairseq's ``transformer`` at the same size (64 wide, 2 heads, 2+2 layers), as fairseq's tests
exercise them (tests/test_sequence_generator.py ``TestDiverseBeamSearch``,
``TestDiverseSiblingsSearch``, ``TestTopPSamplingSearch``; tests/test_binaries.py
``test_generation``, ``test_eval_bleu``, ``test_transformer_layerdrop``; tests/test_constraints.py;
tests/test_roberta.py and the RoBERTa head tests of test_binaries.py).

fairseq's own tests run its search strategies on a mock model with fixed probabilities; here
they run on real models, so each expected value is computed here, independently: a greedy
decoder written with full forwards, the model's full-forward log-probabilities of each
hypothesis, SacreBLEU on the hypotheses. RealFormer (He et al. 2020, arXiv 2012.11747) is the
``realformer_tiny`` model (residual attention on all three chains, ADMIN residuals).

Where another test file covers a feature, docs/guarantees.md ("fairseq features") cites it.
"""

import argparse
import json
import math
import re

import pytest
import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator
from fairseq.sequence_scorer import SequenceScorer
from harness import (
    USER_DIR,
    build_fairseq_tiny_transformer,
    build_translation_model,
    fairseq_command,
    generate,
    preprocess,
    run,
    toy_dictionary,
    translation_train_args,
)
from test_transformer_align import reversal_data

ARCHS = ["transformer", "realformer_tiny"]  # fairseq's, the plugin's (RealFormer + ADMIN)
MAX_LEN_B = 10
# batched incremental decoding vs one full forward per sentence (fairseq's fused kernels)
ATOL = 1e-4


def translation_model(arch: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    if arch == "transformer":
        model, dictionary = build_fairseq_tiny_transformer(
            encoder_layers=2, decoder_layers=2, **overrides
        )
    else:
        model, dictionary = build_translation_model(arch, **overrides)
    return model.eval(), dictionary


def source_sample(dictionary, bsz: int = 4, src_len: int = 8, seed: int = 5):
    """Random sources, two rows left-padded (as fairseq's collater pads them)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(dictionary.nspecial, len(dictionary), (bsz, src_len), generator=g)
    src[:, -1] = dictionary.eos()
    src[1, :3] = dictionary.pad()
    src[3, :5] = dictionary.pad()
    return {"net_input": {"src_tokens": src, "src_lengths": src.ne(dictionary.pad()).sum(1)}}


def unpadded_source(sample, i, pad):
    src = sample["net_input"]["src_tokens"][i]
    return src[src.ne(pad)].unsqueeze(0)


def full_forward_lprobs(model, src, tokens, eos, temperature=1.0):
    """log p(token | previous tokens) of every position of ``tokens`` (ending in eos), from
    one full forward of the unpadded sentence: (len(tokens), vocab)."""
    prev = torch.cat([torch.tensor([eos]), tokens[:-1]]).unsqueeze(0)
    with torch.no_grad():
        logits, extra = model(src, torch.tensor([src.size(1)]), prev)
        lprobs = model.get_normalized_probs((logits / temperature, extra), log_probs=True)
    return lprobs[0]


def greedy_reference(model, src, dictionary, max_len=MAX_LEN_B):
    """Greedy decoding written with full forwards and SequenceGenerator's rules: never pad,
    no eos at the first step (``min_len`` 1), eos at step ``max_len``. Returns the tokens
    (ending in eos) and their log-probabilities."""
    eos, pad = dictionary.eos(), dictionary.pad()
    tokens, scores = [], []
    for step in range(max_len + 1):
        prev = torch.tensor([[eos] + tokens])
        with torch.no_grad():
            out = model(src, torch.tensor([src.size(1)]), prev)
            lprobs = model.get_normalized_probs(out, log_probs=True)[0, -1].clone()
        allowed = lprobs.clone()
        allowed[pad] = -math.inf
        if step == 0:
            allowed[eos] = -math.inf
        if step == max_len:
            allowed[:] = -math.inf
            allowed[eos] = 0
        token = int(allowed.argmax())
        tokens.append(token)
        scores.append(float(lprobs[token]))
        if token == eos:
            break
    return torch.tensor(tokens), torch.tensor(scores)


def generate_with(model, dictionary, sample, beam, search_strategy=None, models=None, **kwargs):
    generator = SequenceGenerator(
        models or [model],
        dictionary,
        beam_size=beam,
        max_len_b=MAX_LEN_B,
        search_strategy=search_strategy,
    )
    return generator.generate(models or [model], sample, **kwargs)


def assert_scored_by_the_model(model, dictionary, sample, hypos, temperature=1.0):
    """Every hypothesis's positional scores are the model's full-forward log-probabilities."""
    for i, sentence in enumerate(hypos):
        src = unpadded_source(sample, i, dictionary.pad())
        for hypo in sentence:
            lprobs = full_forward_lprobs(model, src, hypo["tokens"], dictionary.eos(), temperature)
            expected = lprobs.gather(-1, hypo["tokens"].unsqueeze(-1)).squeeze(-1)
            torch.testing.assert_close(hypo["positional_scores"], expected, rtol=0, atol=ATOL)


# ------------------------------------------------------------- search strategies


@pytest.mark.parametrize("arch", ARCHS)
def test_searches_that_reduce_to_greedy_decoding_give_the_greedy_hypothesis(arch):
    """Beam 1, top-k sampling with k=1, top-p sampling with p below the top probability
    (fairseq's ``test_topp_sampling_search_low_prob``), and diverse beam search with no
    diversity (``TestDiverseBeamSearch``: two groups, strength 0, so both hypotheses are the
    same) all give the greedy hypothesis and its log-probabilities."""
    model, d = translation_model(arch)
    sample = source_sample(d)
    greedy = [greedy_reference(model, unpadded_source(sample, i, d.pad()), d) for i in range(4)]
    strategies = {
        "beam 1": (1, None),
        "top-k 1": (2, search.Sampling(d, sampling_topk=1)),
        "top-p 0.01": (2, search.Sampling(d, sampling_topp=0.01)),
        "diverse beam, strength 0": (2, search.DiverseBeamSearch(d, 2, 0.0)),
    }
    for name, (beam, strategy) in strategies.items():
        torch.manual_seed(1)
        hypos = generate_with(model, d, sample, beam, strategy)
        for sentence, (tokens, scores) in zip(hypos, greedy):
            assert len(sentence) == beam, name
            for hypo in sentence:
                assert torch.equal(hypo["tokens"], tokens), name
                torch.testing.assert_close(
                    hypo["positional_scores"], scores, rtol=0, atol=ATOL, msg=name
                )


@pytest.mark.parametrize("arch", ARCHS)
def test_sampling_draws_from_the_top_k_or_top_p_of_the_tempered_distribution(arch):
    """fairseq's ``test_generation`` samplers (``--sampling --temperature 2``,
    ``--sampling-topk 3``, ``--sampling-topp``, beam 2): each sampled token is among the
    top k (or inside the top-p mass) of the model's full-forward distribution divided by the
    temperature, and its positional score is that log-probability."""
    model, d = translation_model(arch)
    sample = source_sample(d)
    cases = [
        (search.Sampling(d, sampling_topk=3), 2.0),
        (search.Sampling(d, sampling_topp=0.3), 1.0),
    ]
    for strategy, temperature in cases:
        torch.manual_seed(2)
        generator = SequenceGenerator(
            [model], d, beam_size=2, max_len_b=MAX_LEN_B, search_strategy=strategy,
            temperature=temperature,
        )  # fmt: skip
        hypos = generator.generate([model], sample)
        assert_scored_by_the_model(model, d, sample, hypos, temperature)
        distinct = set()
        for i, sentence in enumerate(hypos):
            src = unpadded_source(sample, i, d.pad())
            for hypo in sentence:
                tokens = hypo["tokens"]
                distinct.add(tuple(tokens.tolist()))
                lprobs = full_forward_lprobs(model, src, tokens, d.eos(), temperature)
                lprobs[:, d.pad()] = -math.inf
                lprobs[0, d.eos()] = -math.inf  # min_len 1
                for t, token in enumerate(tokens.tolist()):
                    if t == MAX_LEN_B:  # eos forced at max_len
                        continue
                    order = lprobs[t].argsort(descending=True).tolist()
                    if strategy.sampling_topk > 0:
                        assert token in order[:3], (t, token)
                    else:  # the smallest set of tokens whose mass reaches p, plus the top one
                        probs = lprobs[t].exp()[order]
                        inside = int((probs.cumsum(0) < 0.3).sum()) + 1
                        assert token in order[:inside], (t, token)
        assert len(distinct) > 4  # 8 samples: sampling, not a deterministic search


@pytest.mark.parametrize("arch", ARCHS)
def test_diverse_beam_search_penalises_the_tokens_of_earlier_groups(arch):
    """``--diverse-beam-groups 2 --diverse-beam-strength 0.5`` (fairseq 0.12.3's cumulative
    diversity): the second group's score of a token is its log-probability minus 0.5 times
    (1 + the earlier steps at which the groups agreed) where the first group took the same
    token at that step, so each positional score is the model's log-probability minus a
    whole multiple of 0.5, and the groups' hypotheses differ."""
    model, d = translation_model(arch)
    sample = source_sample(d)
    hypos = generate_with(model, d, sample, 2, search.DiverseBeamSearch(d, 2, 0.5))
    penalties = []
    for i, sentence in enumerate(hypos):
        src = unpadded_source(sample, i, d.pad())
        assert len(sentence) == 2
        for hypo in sentence:
            lprobs = full_forward_lprobs(model, src, hypo["tokens"], d.eos())
            full = lprobs.gather(-1, hypo["tokens"].unsqueeze(-1)).squeeze(-1)
            penalty = (full - hypo["positional_scores"]) / 0.5
            torch.testing.assert_close(penalty, penalty.round(), rtol=0, atol=1e-3)
            assert all(x >= 0 for x in penalty.round().tolist())
            penalties += penalty.round().tolist()
    assert any(x > 0 for x in penalties)
    assert any(not torch.equal(s[0]["tokens"], s[1]["tokens"]) for s in hypos)


@pytest.mark.parametrize("arch", ARCHS)
def test_diverse_siblings_search_penalises_each_sibling_by_its_rank(arch):
    """``--diversity-rate`` (fairseq's ``TestDiverseSiblingsSearch``): with rate 0 it is beam
    search; with rate 0.5, from the second step on, each candidate's score is its
    log-probability minus 0.5 times its rank among its siblings (1, 2, ...)."""
    model, d = translation_model(arch)
    sample = source_sample(d)
    beam = generate_with(model, d, sample, 3)
    siblings_0 = generate_with(model, d, sample, 3, search.DiverseSiblingsSearch(d, 0.0))
    for beam_hypos, sibling_hypos in zip(beam, siblings_0):
        for a, b in zip(beam_hypos, sibling_hypos):
            assert torch.equal(a["tokens"], b["tokens"])
            torch.testing.assert_close(a["score"], b["score"], rtol=0, atol=1e-6)
    hypos = generate_with(model, d, sample, 3, search.DiverseSiblingsSearch(d, 0.5))
    for i, sentence in enumerate(hypos):
        src = unpadded_source(sample, i, d.pad())
        for hypo in sentence:
            lprobs = full_forward_lprobs(model, src, hypo["tokens"], d.eos())
            full = lprobs.gather(-1, hypo["tokens"].unsqueeze(-1)).squeeze(-1)
            rank = (full - hypo["positional_scores"]) / 0.5
            torch.testing.assert_close(rank, rank.round(), rtol=0, atol=1e-3)
            assert rank[0].round() == 0 and all(1 <= r <= 6 for r in rank[1:].round().tolist())


# ------------------------------------------------ prefix, constraints, rescoring


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_tokens_are_kept_and_scored_by_the_model(arch):
    """``--prefix-size 2`` (``test_generation``) hands the generator the first target
    tokens: every hypothesis starts with them, and the prefix is scored by the model too."""
    model, d = translation_model(arch)
    sample = source_sample(d)
    g = torch.Generator().manual_seed(7)
    prefix = torch.randint(d.nspecial, len(d), (4, 2), generator=g)
    hypos = generate_with(model, d, sample, 3, prefix_tokens=prefix)
    for i, sentence in enumerate(hypos):
        assert len(sentence) == 3
        for hypo in sentence:
            assert torch.equal(hypo["tokens"][:2], prefix[i])
    assert_scored_by_the_model(model, d, sample, hypos)
    # without the prefix the best hypotheses start otherwise
    free = generate_with(model, d, sample, 3)
    assert any(not torch.equal(s[0]["tokens"][:2], prefix[i]) for i, s in enumerate(free))


def contains(tokens, phrase):
    n = len(phrase)
    return any(tokens[i : i + n] == phrase for i in range(len(tokens) - n + 1))


def contains_in_order(tokens, phrases):
    start = 0
    for phrase in phrases:
        n = len(phrase)
        hits = [i for i in range(start, len(tokens) - n + 1) if tokens[i : i + n] == phrase]
        if not hits:
            return False
        start = hits[0] + n
    return True


@pytest.mark.parametrize("representation", ["ordered", "unordered"])
@pytest.mark.parametrize("arch", ARCHS)
def test_lexically_constrained_decoding_puts_every_constraint_in_every_hypothesis(
    arch, representation
):
    """``fairseq-interactive --constraints`` (``LexicallyConstrainedBeamSearch``, Post & Vilar
    2018; fairseq's tests/test_constraints.py): each of the beam's hypotheses contains every
    constraint phrase (in the given order for ``ordered``), and is scored by the model."""
    from fairseq.token_generation_constraints import pack_constraints

    model, d = translation_model(arch)
    sample = source_sample(d)
    g = torch.Generator().manual_seed(11)
    words = lambda n: torch.randint(d.nspecial, len(d), (n,), generator=g)  # noqa: E731
    constraints = [[words(1), words(2)] for _ in range(4)]
    strategy = search.LexicallyConstrainedBeamSearch(d, representation)
    hypos = generate_with(model, d, sample, 4, strategy, constraints=pack_constraints(constraints))
    # untrained models end their hypotheses at the maximum length only, where fairseq keeps
    # those that have met every constraint
    assert all(1 <= len(sentence) <= 4 for sentence in hypos)
    for sentence, phrases in zip(hypos, constraints):
        phrases = [p.tolist() for p in phrases]
        for hypo in sentence:
            tokens = hypo["tokens"].tolist()
            assert tokens[-1] == d.eos() and math.isfinite(hypo["score"])
            assert all(contains(tokens, p) for p in phrases), (tokens, phrases)
            if representation == "ordered":
                assert contains_in_order(tokens, phrases), (tokens, phrases)
    assert_scored_by_the_model(model, d, sample, hypos)
    free = generate_with(model, d, sample, 4)
    assert not all(
        contains(s[0]["tokens"].tolist(), c[1].tolist()) for s, c in zip(free, constraints)
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_score_reference_scores_equal_a_full_forward_of_each_sentence(arch):
    """``--score-reference`` (fairseq's ``SequenceScorer``) on a padded batch scores each
    reference, and attends over its source, as one full forward of the unpadded sentence
    does."""
    model, d = translation_model(arch)
    sample = source_sample(d)
    g = torch.Generator().manual_seed(3)
    lengths = [5, 3, 6, 2]
    targets = [torch.cat([torch.randint(d.nspecial, len(d), (n,), generator=g), torch.tensor([d.eos()])]) for n in lengths]  # fmt: skip
    from fairseq.data import data_utils

    sample["target"] = data_utils.collate_tokens(targets, d.pad(), d.eos())
    sample["net_input"]["prev_output_tokens"] = data_utils.collate_tokens(
        targets, d.pad(), d.eos(), move_eos_to_beginning=True
    )
    hypos = SequenceScorer(d).generate([model], sample)
    for i, (sentence, target) in enumerate(zip(hypos, targets)):
        assert len(sentence) == 1 and torch.equal(sentence[0]["tokens"], target)
        src = unpadded_source(sample, i, d.pad())
        lprobs = full_forward_lprobs(model, src, target, d.eos())
        expected = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(sentence[0]["positional_scores"], expected, rtol=0, atol=ATOL)
        torch.testing.assert_close(sentence[0]["score"], expected.mean(), rtol=0, atol=ATOL)
        # the decoder's attention (last layer, mean of the heads) over the left-padded source
        attention = sentence[0]["attention"]
        assert attention.shape == (max(lengths) + 1, sample["net_input"]["src_tokens"].size(1))
        prev = torch.cat([target[-1:], target[:-1]]).unsqueeze(0)
        with torch.no_grad():
            alone = model(src, torch.tensor([src.size(1)]), prev)[1]["attn"][0][0]
        real = attention[: len(target), -src.size(1) :]
        torch.testing.assert_close(real, alone, rtol=0, atol=ATOL)
        assert not attention[: len(target), : -src.size(1)].any()


# ----------------------------------------------------------- ensembles, LayerDrop


@pytest.mark.parametrize("arch", ARCHS)
def test_an_ensemble_of_a_model_with_itself_is_the_model(arch):
    """``--path a.pt:a.pt``: fairseq's ``EnsembleModel`` averages the probabilities."""
    model, d = translation_model(arch)
    sample = source_sample(d)
    single = generate_with(model, d, sample, 3)
    double = generate_with(model, d, sample, 3, models=[model, model])
    for a_hypos, b_hypos in zip(single, double):
        for a, b in zip(a_hypos, b_hypos):
            assert torch.equal(a["tokens"], b["tokens"])
            torch.testing.assert_close(
                a["positional_scores"], b["positional_scores"], rtol=0, atol=1e-5
            )


def test_an_ensemble_of_fairseqs_and_the_plugins_model_averages_their_probabilities():
    """``--path fairseq.pt:realformer.pt`` (the same dictionary): each positional score is
    the log of the mean of the two models' full-forward probabilities."""
    ours, d = translation_model("realformer_tiny")
    theirs, _ = translation_model("transformer", seed=1)
    sample = source_sample(d)
    hypos = generate_with(ours, d, sample, 3, models=[ours, theirs])
    for i, sentence in enumerate(hypos):
        src = unpadded_source(sample, i, d.pad())
        for hypo in sentence:
            tokens = hypo["tokens"]
            probs = [
                full_forward_lprobs(m, src, tokens, d.eos()).exp().gather(-1, tokens[:, None])
                for m in (ours, theirs)
            ]
            expected = ((probs[0] + probs[1]) / 2).log().squeeze(-1)
            torch.testing.assert_close(hypo["positional_scores"], expected, rtol=0, atol=ATOL)
            alone = full_forward_lprobs(ours, src, tokens, d.eos()).gather(-1, tokens[:, None])
            assert not torch.allclose(alone.squeeze(-1), expected, atol=1e-2)


@pytest.mark.parametrize("arch", ARCHS)
def test_layerdrop_model_generates_with_every_layer(arch):
    """A model trained with ``--encoder-layerdrop/--decoder-layerdrop`` (fairseq's
    ``test_transformer_layerdrop``) runs every layer in ``fairseq-generate`` (eval mode): it
    generates what the same weights without LayerDrop generate. (Pruning at inference,
    ``--model-overrides`` ``*_layers_to_keep``, is in test_supported_flags.py.)"""
    layerdrop = dict(encoder_layerdrop=0.5, decoder_layerdrop=0.5, dropout=0.0)
    dropped, d = translation_model(arch, **layerdrop)
    full, _ = translation_model(arch, dropout=0.0)
    state = {k: v for k, v in dropped.state_dict().items()}
    full.load_state_dict(state)
    sample = source_sample(d)
    for a_hypos, b_hypos in zip(
        generate_with(dropped, d, sample, 3), generate_with(full, d, sample, 3)
    ):
        for a, b in zip(a_hypos, b_hypos):
            assert torch.equal(a["tokens"], b["tokens"])
            torch.testing.assert_close(
                a["positional_scores"], b["positional_scores"], rtol=0, atol=1e-6
            )
    # in training mode LayerDrop is on
    src, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    prev = torch.full((4, 3), d.eos())
    with torch.no_grad():
        outs = []
        for seed in range(4):
            dropped.train()
            torch.manual_seed(seed)
            outs.append(dropped(src, lengths, prev)[0])
        dropped.eval()
        eval_out = dropped(src, lengths, prev)[0]
    assert any(not torch.allclose(out, eval_out, atol=1e-4) for out in outs)


# ----------------------------------------------------------------- RoBERTa heads


BERT_TINY = ["--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128"]
BERT_TINY += ["--encoder-attention-heads", "2", "--encoder-layers", "2"]
ROBERTA = {
    "fairseq": ["--arch", "roberta", *BERT_TINY],
    "ours-off": ["--arch", "postln_bert_tiny"],
    "ours-on": ["--arch", "realformer_bert_tiny"],
}
HEADS = {"classification": ["--num-classes", "3"], "regression": ["--num-classes", "1", "--regression-target"]}  # fmt: skip


@pytest.fixture(scope="module")
def sentence_prediction_dicts(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentence-prediction-dicts")
    dictionary = toy_dictionary()
    dictionary.add_symbol("<mask>")
    (root / "input0").mkdir()
    dictionary.save(str(root / "input0" / "dict.txt"))
    (root / "label").mkdir()
    labels = type(dictionary)()
    for label in ("0", "1", "2"):
        labels.add_symbol(label)
    labels.save(str(root / "label" / "dict.txt"))
    return root


def build_sentence_prediction(root, model_flags, head_flags):
    """Parse a ``fairseq-train --task sentence_prediction`` command line and build its model
    (with its head) and criterion, as fairseq-train does."""
    from fairseq import options, tasks

    argv = [str(root), "--user-dir", USER_DIR, "--task", "sentence_prediction", "--cpu"]
    argv += ["--criterion", "sentence_prediction", "--max-positions", "32", "--dropout", "0"]
    args = options.parse_args_and_arch(
        options.get_training_parser(), argv + model_flags + head_flags
    )
    task = tasks.setup_task(args)
    return task.build_model(args), task.build_criterion(args), task


@pytest.mark.parametrize("head", list(HEADS))
def test_roberta_classification_and_regression_heads(sentence_prediction_dicts, head):
    """fairseq's ``test_roberta_sentence_prediction`` / ``test_roberta_regression_single``
    (``--num-classes 3`` or ``--num-classes 1 --regression-target``): with residual attention
    off the plugin's model, head and loss equal fairseq's ``roberta`` with the same weights;
    with it on, the head reads the plugin's features at ``<s>``."""
    built = {}
    for name, flags in ROBERTA.items():
        torch.manual_seed(0)
        built[name] = build_sentence_prediction(sentence_prediction_dicts, flags, HEADS[head])
    (vanilla, criterion, task), (ours, _, _), (on, _, _) = built.values()
    num_classes = 1 if head == "regression" else 3
    for model in (vanilla, ours, on):
        out_proj = model.classification_heads["sentence_classification_head"].out_proj
        assert out_proj.out_features == num_classes
    state = {k: v for k, v in vanilla.state_dict().items()}
    missing, unexpected = ours.load_state_dict(state, strict=False)
    assert missing == ["admin_profiled"] and unexpected == []
    d = task.source_dictionary
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(d.nspecial, len(d) - 1, (3, 9), generator=g)
    tokens[:, 0], tokens[:, -1] = d.bos(), d.eos()
    tokens[1, 6:] = d.pad()
    target = torch.tensor([0.5, -1.0, 2.0]) if head == "regression" else torch.tensor([0, 2, 1])
    sample = {
        "net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(d.pad()).sum(1)},
        "target": target.unsqueeze(-1) if head == "regression" else target,
        "ntokens": int(tokens.ne(d.pad()).sum()),
        "nsentences": 3,
    }
    for model in (vanilla, ours, on):
        model.eval()
    with torch.no_grad():
        out = [m(tokens, features_only=True, classification_head_name="sentence_classification_head")[0] for m in (vanilla, ours, on)]  # fmt: skip
        losses = [criterion(m, sample)[0] for m in (vanilla, ours, on)]
        features = on.encoder.extract_features(tokens)[0]
        head_module = on.classification_heads["sentence_classification_head"]
        assert head_module.activation_fn is torch.tanh  # fairseq's pooler activation
        expected_on = head_module.out_proj(torch.tanh(head_module.dense(features[:, 0, :])))
    assert out[0].shape == (3, num_classes)
    assert torch.equal(out[1], out[0]) and torch.equal(losses[1], losses[0])
    torch.testing.assert_close(out[2], expected_on, rtol=0, atol=1e-6)
    if head == "regression":
        expected_loss = torch.nn.functional.mse_loss(out[2].view(-1), target, reduction="sum")
    else:
        expected_loss = torch.nn.functional.cross_entropy(out[2], target, reduction="sum")
    torch.testing.assert_close(losses[2], expected_loss, rtol=1e-6, atol=1e-6)


# ----------------------------------------------- fairseq-train --eval-bleu, console

EVAL_BLEU_ARGS = {"beam": 2, "min_len": 5, "max_len_b": 10}  # fairseq's test: min_len 10


@pytest.fixture(scope="module")
def eval_bleu_run(tmp_path_factory):
    """``fairseq-train --eval-bleu`` of ``realformer_tiny`` (fairseq's ``test_eval_bleu``),
    checkpoints picked by BLEU, on word reversal data; then ``fairseq-generate
    --score-reference`` of its checkpoint."""
    root = tmp_path_factory.mktemp("eval-bleu")
    (root / "raw").mkdir()
    data_bin = preprocess(reversal_data(root / "raw"), root / "bin")
    save_dir = root / "ck"
    train_out = run(
        [
            fairseq_command("fairseq-train"),
            *translation_train_args(
                data_bin, save_dir, max_update=100,
                extra=[
                    "--max-tokens", "500", "--lr", "5e-3", "--validate-interval", "10",
                    # fairseq 0.12 drops a last batch of fewer (upstream issue 5036): without
                    # it, validation (loss and BLEU) would see 24 of the 30 sentences
                    "--required-batch-size-multiple", "1",
                    "--eval-bleu", "--eval-bleu-detok", "space", "--eval-bleu-print-samples",
                    "--eval-bleu-args", json.dumps(EVAL_BLEU_ARGS),
                    "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
                ],
            ),
        ]
    )  # fmt: skip
    checkpoint = save_dir / "checkpoint_last.pt"
    score_out = generate(data_bin, checkpoint, extra=["--score-reference"])
    return data_bin, checkpoint, train_out, score_out


def validation_hypotheses(checkpoint):
    """The valid set's hypotheses and references of the checkpoint, generated in this
    process with the generator ``--eval-bleu-args`` asks for, as strings (no BPE, space
    detokenizer)."""
    from fairseq import checkpoint_utils, utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    model = models[0].eval()
    task.load_dataset("valid")
    generator = task.build_generator([model], argparse.Namespace(**EVAL_BLEU_ARGS))
    itr = task.get_batch_iterator(task.dataset("valid"), max_tokens=500).next_epoch_itr(
        shuffle=False
    )
    d = task.target_dictionary
    hyps, refs = [], []
    for sample in itr:
        for i, hypos in enumerate(task.inference_step(generator, [model], sample)):
            hyps.append(d.string(hypos[0]["tokens"].int(), unk_string="UNKNOWNTOKENINHYP"))
            target = utils.strip_pad(sample["target"][i], d.pad())
            refs.append(d.string(target.int(), unk_string="UNKNOWNTOKENINREF"))
    return hyps, refs


def test_eval_bleu_logs_sacrebleu_of_the_validation_hypotheses(eval_bleu_run):
    import sacrebleu

    _, checkpoint, train_out, _ = eval_bleu_run
    valid = re.findall(
        r"valid on 'valid' subset \| .*? bleu ([\d.]+) .*? num_updates (\d+)", train_out
    )
    assert [int(n) for _, n in valid][-1] == 100 and len(valid) >= 2
    logged = float(valid[-1][0])
    hyps, refs = validation_hypotheses(checkpoint)
    assert len(hyps) == 30
    expected = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert expected > 1.0  # the tiny model has learnt something
    assert logged == pytest.approx(expected, abs=0.006), (logged, expected)
    samples = re.findall(r"example hypothesis: (.*)$", train_out, flags=re.M)
    assert samples and samples[-1] in hyps
    assert re.search(r"best_bleu [\d.]+", train_out)


def test_generate_score_reference_prints_the_full_forward_scores(eval_bleu_run):
    """``fairseq-generate --score-reference``: each hypothesis is its reference, with the
    checkpoint's full-forward log-probabilities (printed in base 2)."""
    from fairseq import checkpoint_utils

    _, checkpoint, _, out = eval_bleu_run
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    model, d = models[0].eval(), task.source_dictionary
    rows = {}
    for key in ("S", "T", "H", "P"):
        rows[key] = dict(re.findall(rf"^{key}-(\d+)\t(.*)$", out, flags=re.M))
    assert len(rows["T"]) == len(rows["P"]) == 12
    for i, target in rows["T"].items():
        assert rows["H"][i].split("\t")[1] == target
        src = d.encode_line(rows["S"][i], add_if_not_exist=False).long().unsqueeze(0)
        tokens = d.encode_line(target, add_if_not_exist=False).long()
        lprobs = full_forward_lprobs(model, src, tokens, d.eos())
        expected = lprobs.gather(-1, tokens[:, None]).squeeze(-1) / math.log(2)
        printed = torch.tensor([float(x) for x in rows["P"][i].split()])
        torch.testing.assert_close(printed, expected, rtol=0, atol=2e-4)


def interactive_hypotheses(data_bin, checkpoint, input_path, *extra):
    """``fairseq-interactive`` of ``checkpoint`` on ``input_path``: [(id, hypothesis)]."""
    out = run(
        [
            fairseq_command("fairseq-interactive"), data_bin, "--user-dir", USER_DIR,
            "--path", checkpoint, "-s", "en", "-t", "fr", "--beam", "4", "--cpu",
            "--input", input_path, *extra,
        ]
    )  # fmt: skip
    return [(int(i), h) for i, h in re.findall(r"^H-(\d+)\t\S+\t(.*)$", out, flags=re.M)]


def test_interactive_constraints_appear_in_every_hypothesis(eval_bleu_run, tmp_path):
    """The real command: ``fairseq-interactive --constraints ordered`` with tab-separated
    constraint phrases after each source line (fairseq's input format), nbest 4."""
    data_bin, checkpoint, _, _ = eval_bleu_run
    sources = ["w1 w2 w3 w4", "w5 w6 w7", "w8 w9 w10 w11 w12"]
    constraints = [["W9", "W3 W2"], ["W0 W11"], ["W14", "W13", "W15 W15"]]
    constrained, plain = tmp_path / "constrained.en", tmp_path / "plain.en"
    constrained.write_text(
        "".join("\t".join([s, *c]) + "\n" for s, c in zip(sources, constraints)), "utf-8"
    )
    plain.write_text("".join(s + "\n" for s in sources), "utf-8")

    def meets_constraints(i, hypothesis):
        return contains_in_order(hypothesis.split(), [c.split() for c in constraints[i]])

    hypotheses = interactive_hypotheses(
        data_bin, checkpoint, constrained, "--constraints", "ordered", "--nbest", "4"
    )
    assert sorted({i for i, _ in hypotheses}) == [0, 1, 2]
    for i, hypothesis in hypotheses:
        assert meets_constraints(i, hypothesis), (hypothesis, constraints[i])
    free = interactive_hypotheses(data_bin, checkpoint, plain)
    assert len(free) == 3 and not all(meets_constraints(i, h) for i, h in free)
