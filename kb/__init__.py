"""kb: a knowledge base that diagnoses NaN / inf / collapsing losses in LLM fine-tuning and RLHF."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Incident", "KnowledgeBase", "__version__", "watch"]


def __getattr__(name: str):
    # Lazy so that `import kb.canonical` (used by light tools) does not load the index machinery.
    if name == "KnowledgeBase":
        from kb.kb import KnowledgeBase

        return KnowledgeBase
    if name == "Incident":
        from kb.records import Incident

        return Incident
    if name == "watch":
        from kb.integrations.watch import watch

        return watch
    raise AttributeError(name)
