"""realformer_fairseq: a fairseq ``--user-dir`` plugin.

RealFormer residual attention (He et al., 2020, arXiv 2012.11747) on
ADMIN-initialised transformers (Liu et al., 2020, arXiv 2004.08249). Importing the
package registers its models, architectures, task, criteria and optimizer with fairseq and
installs the fairseq patches listed in :mod:`realformer_fairseq.fairseq_patches`.
"""

from . import fairseq_patches
from .criterions import masked_lm_accuracy  # noqa: F401
from .criterions import squad_span  # noqa: F401
from .models import realformer_lm  # noqa: F401
from .models import realformer_roberta  # noqa: F401
from .models import realformer_transformer  # noqa: F401
from .models import realformer_transformer_align  # noqa: F401
from .optim import radam  # noqa: F401
from .tasks import squad  # noqa: F401 (task squad: SQuAD v1.1 / v2.0 span extraction)
from .tf_import import wordpiece  # noqa: F401 (registers --bpe wordpiece)

fairseq_patches.install()  # the only changes to fairseq itself: see fairseq_patches.py

__version__ = "0.1.0"
