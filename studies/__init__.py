"""The project's studies: measurements of the realformer_fairseq plugin, not part of it.

RealFormer (He, Ravula, Kanagal, Ainslie, arXiv 2012.11747) and ADMIN (Liu et al., arXiv
2004.08249 / 2008.07772) measured at CPU scale, and a GPU check. Run from the repository root
as ``python -m studies.NAME`` (each module's docstring has its usage):

===========================  ==============================================================
``benchmark_speed``          NMT speed and memory against fairseq's ``transformer`` (CPU)
``benchmark_lm``             the same for the language models, against ``transformer_lm``
``saved_tensors``            what autograd keeps per layer: RealFormer vs fairseq's paths
``gpu_check``                fp16/bf16 training, speed and generation on one GPU; ``--plan``
``triton_cost``              the triton route's cost on an H100 / H200, per gpu_check case
``triton_compile_times``     Triton's compile seconds per kernel for sm_90 (no GPU)
``convergence``              Post-LN / Pre-LN / ADMIN / RealFormer+ADMIN on Multi30k En-Fr
``nmt_depth``                ADMIN / RealFormer+ADMIN / Post-LN at 18L-6L on Tatoeba En-Fr
``lm_comparison``            the same four as language models on Multi30k English
``paper_checks``             the paper's masked-LM, stability and attention claims
===========================  ==============================================================

Shared helpers: ``runs`` (fairseq subprocesses, results, resume, arguments), ``tables``
(seed means, Markdown), ``plots`` (matplotlib, the ``plots`` extra), ``text`` (the word
tokenizer), ``bench_models`` / ``bench_measure`` (the benchmarks' models, timing and memory),
``bench_trainer`` (fairseq's own ``Trainer.train_step`` from a user's flags), ``gpu_cases``
(gpu_check's cases), ``gpu_plan`` (its parts' estimated seconds and budget) and
``triton_build`` (the triton kernels compiled for a GPU target without a GPU: signatures,
ptxas report, the compile tests' checks).
The plugin never imports this package (``tests/test_import_graph.py``).
"""
