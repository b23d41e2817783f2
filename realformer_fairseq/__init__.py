"""realformer_fairseq: a fairseq ``--user-dir`` plugin.

RealFormer residual attention (He et al., 2020, arXiv 2012.11747) on
ADMIN-initialised transformers (Liu et al., 2020, arXiv 2004.08249). Importing the
package registers its architectures with fairseq.
"""

from . import checkpoint_compat  # noqa: F401
from . import interactive_compat  # noqa: F401
from . import errors
from .criterions import masked_lm_accuracy  # noqa: F401
from .models import realformer_lm  # noqa: F401
from .models import realformer_roberta  # noqa: F401
from .models import realformer_transformer  # noqa: F401
from .optim import radam  # noqa: F401

checkpoint_compat.install()
errors.install_one_line_excepthook()
interactive_compat.install()

__version__ = "0.1.0"
