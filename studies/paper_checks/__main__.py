"""``python -m studies.paper_checks``: see the package docstring (RealFormer, arXiv 2012.11747)."""

from ..runs import main_entry
from .driver import main

main_entry("studies.paper_checks", main)
