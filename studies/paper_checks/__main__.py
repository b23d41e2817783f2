"""``python -m studies.paper_checks``: see the package docstring (RealFormer, arXiv 2012.11747)."""

from .driver import main

main()
