"""realformer-fairseq: RealFormer residual attention and ADMIN init as a fairseq plugin."""

from setuptools import find_packages, setup

with open("README.md", encoding="utf-8") as fh:
    long_description = fh.read()

setup(
    name="realformer-fairseq",
    version="0.1.0",
    description=(
        "RealFormer (residual attention, He et al. 2020) on ADMIN-initialised "
        "fairseq transformers"
    ),
    long_description=long_description,
    long_description_content_type="text/markdown",
    license="MIT",
    # a fairseq 0.12 build that works exists for 3.10 (official fairseq 0.12.2, sdist) and
    # 3.11-3.12 (ve-fairseq wheels); none for 3.13 (see README, "Python versions")
    python_requires=">=3.10,<3.13",
    packages=find_packages(
        include=["realformer_fairseq", "realformer_fairseq.*", "realformer_pipelines"]
    ),
    install_requires=[
        # fairseq 0.12.2 does not import on Python 3.11+; ve-fairseq is the same code
        # base as prebuilt cp311/cp312 wheels (see README, "Choice of fairseq").
        've-fairseq==0.12.3; python_version >= "3.11" and python_version < "3.13"',
        'fairseq==0.12.2; python_version < "3.11"',
        # 2.13.0 (the CPU wheel on the build machines) must satisfy this range; 2.5 is the
        # first with torch.serialization.safe_globals, which checkpoint_compat and
        # realformer-average-checkpoints load every checkpoint with (weights_only=True)
        "torch>=2.5,<2.15",
        # numpy 1.x and 2.x: what fairseq 0.12 asks of numpy that the running numpy removed (a
        # few aliases, one keyword) is supplied to those fairseq modules only (numpy_compat.py);
        # checkpoint_compat names numpy's pickling functions under both numpy 1 and 2 and
        # allow-lists np.dtypes.*DType (pickled into checkpoints), new in numpy 1.25
        "numpy>=1.25",
        "sacrebleu>=2.0",
        # realformer_pipelines/moses.py makes 0.2.0's output equal to Moses perl (tested)
        "sacremoses==0.2.0",
        "subword-nmt>=0.3.8",
        # --tensorboard-logdir: fairseq 0.12 writes with torch.utils.tensorboard, which needs
        # this package (without it fairseq only logs "tensorboard not found" and trains on)
        "tensorboard>=2.10",
        # not for our logging (above): fairseq's task registry imports text_to_speech, which
        # logs "Please install tensorboardX" at INFO during `import fairseq` in every command
        # when it is missing, although TensorBoard logging works. The line fires before
        # --user-dir loads the plugin, so no logging filter of ours could drop it; this 90 kB
        # pure-Python wheel (numpy, packaging, protobuf: all here already) removes the cause
        # and hides none of fairseq's messages
        "tensorboardX>=2.6",
        # realformer-import-tf: BERT's WordPiece tokenisation (HuggingFace's maintained Rust
        # implementation) and the CRC32-C checks of TensorFlow checkpoint files
        "tokenizers>=0.13",
        "google-crc32c>=1.1",
    ],
    extras_require={
        # the figures of realformer-attention-stats (--no-plots needs nothing) and of the
        # studies in studies/ (not installed: run from a clone as python -m studies.NAME)
        "plots": ["matplotlib>=3.5"],
        # GLUE's metrics in examples/glue (scripts of the example, not the plugin: fairseq-train
        # and the plugin never compute them; ve-fairseq's sentence_prediction criterion happens to
        # import both, fairseq 0.12.2 does not)
        "glue": ["scikit-learn>=1.0", "scipy>=1.7"],
        # --residual-attention-impl triton (its fused kernels; its tests run them on CPU under
        # TRITON_INTERPRET=1). CUDA builds of torch ship triton already; scripts/install.sh's
        # CPU venv does not pull it (about 1 GB installed), .ci/run's triton job does
        "triton": ["triton>=3"],
        # the tests draw the figures of realformer-attention-stats and score examples/glue too
        # pytest-xdist: the suite runs on every core (pyproject.toml's addopts: -n auto)
        "test": [
            "pytest>=7",
            "pytest-timeout>=2",
            "pytest-xdist>=3.5",
            "filelock>=3.0",
            "matplotlib>=3.5",
            "scikit-learn>=1.0",
            "scipy>=1.7",
        ],
        "dev": [
            "black",
            "isort",
            "pytest>=7",
            "pytest-timeout>=2",
            "pytest-xdist>=3.5",
            "filelock>=3.0",
        ],
    },
    entry_points={
        "console_scripts": [
            "realformer-average-checkpoints=realformer_fairseq.cli.average_checkpoints:cli_main",
            "realformer-attention-stats=realformer_fairseq.cli.attention_stats:cli_main",
            "realformer-import-tf=realformer_fairseq.cli.import_tf:cli_main",
            "realformer-wordpiece=realformer_pipelines.wordpiece:cli_main",
            "realformer-squad=realformer_fairseq.cli.squad:cli_main",
            "realformer-squad-eval=realformer_fairseq.cli.squad_eval:cli_main",
        ]
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
