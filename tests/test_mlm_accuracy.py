"""The masked_lm_accuracy criterion: fairseq's masked_lm loss plus MLM accuracy."""

import argparse
import types

import torch
from fairseq.criterions.masked_lm import MaskedLmConfig, MaskedLmLoss
from fairseq.logging import metrics
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from harness import toy_dictionary

from realformer_fairseq.criterions.masked_lm_accuracy import MaskedLmAccuracyLoss


def test_loss_equals_fairseq_and_accuracy_counts_argmax_hits():
    torch.manual_seed(0)
    d = toy_dictionary(30)
    task = types.SimpleNamespace(
        source_dictionary=d, target_dictionary=d, dictionary=d, max_positions=lambda: 64
    )
    args = argparse.Namespace(
        arch="realformer_bert_tiny", _name="realformer_bert_tiny", tokens_per_sample=64
    )
    ARCH_CONFIG_REGISTRY["realformer_bert_tiny"](args)
    model = ARCH_MODEL_REGISTRY["realformer_bert_tiny"].build_model(args, task).eval()

    tokens = torch.randint(d.nspecial, len(d), (4, 10))
    target = torch.full_like(tokens, d.pad())
    mask = torch.rand(tokens.shape) < 0.3
    mask[0, 0] = True
    src_tokens = tokens.masked_fill(mask, d.unk())
    with torch.no_grad():
        predicted = model(src_tokens)[0].argmax(-1)  # (bsz, seq_len)
    # targets: the model's own prediction at every other masked position (sure
    # hits), the original token elsewhere
    hits = mask & (torch.arange(tokens.numel()).view_as(tokens) % 2 == 0)
    target[mask] = tokens[mask]
    target[hits] = predicted[hits]
    assert hits.sum() >= 3
    sample = {
        "net_input": {"src_tokens": src_tokens},
        "target": target,
        "ntokens": int(mask.sum()),
        "nsentences": 4,
    }
    ours = MaskedLmAccuracyLoss(MaskedLmConfig(tpu=False), task)
    theirs = MaskedLmLoss(MaskedLmConfig(tpu=False), task)
    with torch.no_grad():
        loss, size, log = ours(model, sample)
        ref_loss, ref_size, _ = theirs(model, sample)
        logits = model(sample["net_input"]["src_tokens"])[0]  # (bsz, seq_len, vocab)
    assert torch.equal(loss, ref_loss) and size == ref_size
    expected_correct = int(logits.argmax(-1)[mask].eq(target[mask]).sum())
    assert expected_correct >= int(hits.sum())
    assert int(log["n_correct"]) == expected_correct

    with metrics.aggregate() as agg:
        MaskedLmAccuracyLoss.reduce_metrics([log, log])
    assert agg.get_smoothed_values()["accuracy"] == round(100.0 * expected_correct / int(size), 2)
