"""realformer_pipelines: the one home of what the shell pipelines of this project share.

The pipelines (``examples/wmt14_en_fr``, ``examples/glue``, ``examples/squad``,
``examples/pretrain_bert``; RealFormer, He et al. 2020, arXiv 2012.11747) each keep their own
stages and recipe in their folder; their shell scripts source ``examples/common/pipeline.sh``
and their Python imports this package, installed with the plugin (``pip install -e .``).

It is a package of its own, not a part of ``realformer_fairseq``: importing anything under
``realformer_fairseq`` runs the plugin's ``__init__``, which imports fairseq and torch (2 s on
a free machine, 8 s on this project's shared 2 cores) and registers the plugin, and the
pipelines call their Python steps dozens of times per run. Importing this package imports
neither fairseq nor torch; the functions that need them import them when called.

Modules (none imported here):

* :mod:`~realformer_pipelines.errors`: the one-line error of every console command;
* :mod:`~realformer_pipelines.files`: atomic writes (whole files, whole folders), line reading;
* :mod:`~realformer_pipelines.checks`: input checks (UTF-8, line counts, binarized data);
* :mod:`~realformer_pipelines.log`: fairseq-style log lines and progress;
* :mod:`~realformer_pipelines.moses`: Moses tokenisation equal to the perl scripts;
* :mod:`~realformer_pipelines.subwords`: subword-nmt and sentencepiece;
* :mod:`~realformer_pipelines.checkpoints`: fairseq checkpoints and a model's flags;
* :mod:`~realformer_pipelines.model_info`: what a model knows (tokenizer, casing, pair layout,
  vocabulary, dictionary), read from the model itself;
* :mod:`~realformer_pipelines.tools`: the command-line tools the shell stages call
  (``python -m realformer_pipelines.tools SUBCOMMAND``).
"""
