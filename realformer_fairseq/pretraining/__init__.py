"""BERT pre-training data and evaluation for the RealFormer comparison (He, Ravula, Kanagal,
Ainslie 2020, arXiv 2012.11747: Post-LN, Pre-LN and RealFormer BERT compared by masked-token
accuracy on held-out text).

A library, not a fairseq extension: nothing here registers anything with fairseq, and the plugin
(``realformer_fairseq/__init__.py``) does not import it.

* :mod:`.mlm_eval`: masked-token accuracy of checkpoints on the held-out split with one fixed
  masking seed, so that every checkpoint and every variant is scored on the same positions.

``examples/pretrain_bert`` is the pipeline that runs it; the data side (corpus, vocabulary,
instances) is the pipeline's own ``pretrain_data.py``, which does not import fairseq.
"""
