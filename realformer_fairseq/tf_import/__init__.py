"""Google's TensorFlow BERT / RealFormer checkpoints in fairseq, without TensorFlow.

He, Ravula, Kanagal, Ainslie 2020 (RealFormer, arXiv 2012.11747) released their BERT models as
TF1 checkpoints in BERT's layout. This package reads them (:mod:`.tensor_bundle`), maps them
to the plugin's ``realformer_roberta`` model (:mod:`.bert_checkpoint`, command
``realformer-import-tf``), tokenises raw text as BERT does (:mod:`.wordpiece`, ``--bpe
wordpiece``, command ``realformer-wordpiece``), and :func:`bert_outputs` computes, with the
imported fairseq model, the arrays a TF run of ``BertModel`` + BERT's pre-training heads gives.
"""

from .outputs import bert_outputs  # noqa: F401
