"""SQuAD v1.1 / v2.0 for the encoder-only models, as google-research/bert ``run_squad.py`` does it
(RealFormer, He et al. 2020, arXiv 2012.11747, reports SQuAD with BERT's fine-tuning):
``features`` (examples and windows, answers mapped through the tokenizer's character offsets),
``data_bin`` (the fairseq data-bin of the features), ``decoding`` (n-best spans, the v2.0 null
score), ``evaluation`` (the official evaluation script's rules), ``predict`` (a fine-tuned
model's answers, the hub's ``answer``). The fairseq task is ``realformer_fairseq.tasks.squad``,
the criterion ``realformer_fairseq.criterions.squad_span``, the span head
``realformer_fairseq.modules.span_head``."""
