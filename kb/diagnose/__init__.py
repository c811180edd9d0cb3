"""Diagnosis: a pasted log / config / command line / question -> facts -> ranked incidents with evidence."""

from kb.diagnose.facts import Fact, Facts, extract_facts
from kb.diagnose.masking import mask_line

__all__ = ["Fact", "Facts", "extract_facts", "mask_line"]
