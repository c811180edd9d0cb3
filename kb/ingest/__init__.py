"""Raw documents (text, markdown, HTML; Chinese or English) and curated incident.md files -> Incident records.

    from kb.ingest import parse_document, read_document
    text, fmt = read_document("article.html")
    result = parse_document(text, name="article.html", fmt=fmt)
    result.incident.root_cause.category, result.category_evidence, result.warnings
"""

from kb.ingest.parse import IngestResult, make_id, parse_document
from kb.ingest.reader import DEFAULT_MAX_BYTES, read_document, size_limit

__all__ = ["DEFAULT_MAX_BYTES", "IngestResult", "make_id", "parse_document", "read_document", "size_limit"]
