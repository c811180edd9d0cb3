"""The fact layer: untrusted input -> canonical facts with line evidence (one boundary, one pipeline)."""

from kb.facts.boundary import check_text, decode, numbered_lines, read_text_file
from kb.facts.masking import mask_line
from kb.facts.model import Fact, Facts
from kb.facts.pipeline import DEFAULT_STAGES, Pipeline, answers_as_facts, extract_facts, facts_from_mapping

__all__ = ["DEFAULT_STAGES", "Fact", "Facts", "Pipeline", "answers_as_facts", "check_text", "decode", "extract_facts",
           "facts_from_mapping", "mask_line", "numbered_lines", "read_text_file"]
