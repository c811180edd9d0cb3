"""Chat message formatting: diagnosis / ask result → platform-neutral Message → Slack, Feishu, DingTalk.

Pure functions, no transport: a new platform is one renderer here plus one transport file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

LABELS = {
    "en": {"diagnosis": "Diagnosis", "answer": "Closest incidents", "nothing": "No known incident fits well",
           "evidence": "Evidence", "fix": "Fix", "repro": "Confirm", "confidence": "confidence",
           "score": "score", "sources": "Sources", "category": "category", "help_title": "kb: why did my loss go NaN?",
           "track": "answers this confident ({band}) were right {pct} % of the time ({reports} of {of} unseen reports)"},
    "zh": {"diagnosis": "诊断结果", "answer": "最相关的事件", "nothing": "知识库中没有足够匹配的事件",
           "evidence": "证据", "fix": "修复", "repro": "验证", "confidence": "置信度",
           "score": "相关度", "sources": "来源", "category": "类别", "help_title": "kb：训练 loss 为什么变成 NaN？",
           "track": "置信度 {band} 的回答有 {pct}% 是对的（{reports}/{of} 份未见过的报告）"},
}
HELP_TEXT = {
    "en": "Send a question (\"DPO nll_loss nan with sequence parallel\") or paste a training log, a config or "
          "the command line; I answer with the matching known incidents, the evidence, the fix and a repro check.",
    "zh": "发送一个问题（如“序列并行 DPO nll_loss 为 nan”）或粘贴训练日志、配置、启动命令；"
          "我会给出匹配的已知事件、证据、修复方法和复现检查命令。",
}
MAX_EVIDENCE = 4
MAX_FIELD = 600  # characters of one fix / evidence line in a chat message


@dataclass
class Item:
    incident_id: str
    title: str
    category: str = ""
    confidence: float | None = None  # diagnosis confidence in [0, 1]
    score: float | None = None  # retrieval score (ask)
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    repro: str = ""
    sources: list[str] = field(default_factory=list)


@dataclass
class Message:
    """What a chat answer says, independent of any platform's markup."""

    heading: str
    lang: str = "en"
    items: list[Item] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # warnings, abstention reason
    abstained: bool = False

    @property
    def labels(self) -> dict[str, str]:
        return LABELS.get(self.lang, LABELS["en"])


def _dump(obj: Any) -> dict:
    return obj.model_dump(mode="json") if hasattr(obj, "model_dump") else dict(obj)


def _clip(text: str, n: int = MAX_FIELD) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _evidence_line(ev: Any) -> str:
    if isinstance(ev, str):
        return _clip(ev)
    kind, detail, line = ev.get("kind", ""), ev.get("detail", ""), ev.get("line")
    source = ev.get("source") or ""
    where = f"{source} line {line}".strip() if line else kind
    return _clip(f"[{where}] {detail}" if where else str(detail))


def from_diagnosis(diagnosis: Any, lang: str = "en", max_items: int = 3) -> Message:
    d = _dump(diagnosis)
    labels = LABELS.get(lang, LABELS["en"])
    items = []
    for x in (d.get("diagnoses") or [])[:max_items]:
        items.append(Item(
            incident_id=str(x.get("incident_id", "")), title=str(x.get("title", "")),
            category=str(x.get("category", "")), confidence=x.get("confidence"),
            evidence=[_evidence_line(e) for e in (x.get("evidence") or [])[:MAX_EVIDENCE]],
            fix=_clip(x.get("fix") or ""), repro=str(x.get("repro") or ""),
        ))
    abstained = bool(d.get("abstained")) or not items
    notes = [_clip(w) for w in (d.get("warnings") or [])[:3]]
    if (abstained or d.get("route") in ("differential", "framework-defect")) and d.get("reason"):
        notes.insert(0, _clip(d["reason"]))
    # The questions that would separate the candidates: the user answers in the thread ("precision=bf16").
    for q in (d.get("questions") or [])[:3]:
        notes.append(_clip(f"? {q.get('question', '')}  → {q.get('fact', '')}=…"))
    for step in (d.get("bisect") or [])[:4]:
        notes.append(_clip(f"bisect: {step}"))
    if d.get("seen_in") and d.get("similar_reports"):
        r = d["similar_reports"][0]
        notes.append(_clip(f"seen in {d['seen_in']} similar report(s), e.g. {r.get('url', '')}"))
    lang = d.get("lang") or lang
    labels = LABELS.get(lang, LABELS["en"])
    rec = d.get("track_record")
    if rec:  # how often answers this confident were right on reports kb had not seen
        notes.append(_clip(labels["track"].format(band=rec.get("band"), pct=rec.get("percent"),
                                                  reports=rec.get("reports"), of=rec.get("of"))))
    return Message(heading=labels["nothing"] if abstained else labels["diagnosis"], lang=lang, items=items,
                   notes=notes, abstained=abstained)


def help_message(lang: str = "en") -> Message:
    return Message(heading=LABELS[lang]["help_title"], lang=lang, notes=[HELP_TEXT[lang]])


def _item_header(item: Item, labels: dict[str, str]) -> str:
    bits = [item.category] if item.category else []
    if item.confidence is not None:
        bits.append(f"{labels['confidence']} {float(item.confidence):.2f}")
    elif item.score is not None:
        bits.append(f"{labels['score']} {float(item.score):.2f}")
    return " · ".join(bits)


def _code(incident_id: str) -> str:
    """An incident id as inline code and a space; nothing for a cause with no curated incident."""
    return f"`{incident_id}` " if incident_id else ""


# ---------------------------------------------------------------- plain text
def to_text(msg: Message) -> str:
    lb = msg.labels
    out = [msg.heading]
    for i, it in enumerate(msg.items, 1):
        out.append(f"\n{i}. {it.title}{f' ({it.incident_id})' if it.incident_id else ''} {_item_header(it, lb)}")
        out += [f"   {lb['evidence']}: {e}" for e in it.evidence]
        if it.fix:
            out.append(f"   {lb['fix']}: {it.fix}")
        if it.repro:
            out.append(f"   {lb['repro']}: {it.repro}")
    out += [f"\n{n}" for n in msg.notes]
    return "\n".join(out)


# ---------------------------------------------------------------- Slack Block Kit
def _slack_escape(text: str) -> str:
    # Slack mrkdwn treats these three as control characters (links, mentions).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_slack(msg: Message) -> dict:
    """{"text": fallback, "blocks": [...]} for chat.postMessage or a response_url."""
    lb = msg.labels
    blocks: list[dict] = [{"type": "header", "text": {"type": "plain_text", "text": _clip(msg.heading, 150)}}]
    for i, it in enumerate(msg.items, 1):
        lines = [f"*{i}. {_slack_escape(it.title)}*" + (f"  `{_slack_escape(it.incident_id)}`" if it.incident_id else ""),
                 f"_{_slack_escape(_item_header(it, lb))}_"]
        if it.evidence:
            lines.append(f"*{lb['evidence']}*")
            lines += [f"• {_slack_escape(e)}" for e in it.evidence]
        if it.fix:
            lines.append(f"*{lb['fix']}*: {_slack_escape(it.fix)}")
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _clip_block("\n".join(lines))}})
        if it.repro:
            blocks.append({"type": "context", "elements": [
                {"type": "mrkdwn", "text": f"{lb['repro']}: `{_slack_escape(it.repro)}`"}]})
        blocks.append({"type": "divider"})
    for note in msg.notes:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": _slack_escape(note)}]})
    return {"text": _clip(to_text(msg), 3000), "blocks": blocks[:50]}


def _clip_block(text: str, n: int = 3000) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


# ---------------------------------------------------------------- Feishu / Lark interactive card
def _lark_escape(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;")


def to_feishu_card(msg: Message) -> dict:
    """An interactive card (msg_type "interactive"); content is this dict as a JSON string."""
    lb = msg.labels
    elements: list[dict] = []
    for i, it in enumerate(msg.items, 1):
        lines = [f"**{i}. {_lark_escape(it.title)}**", _code(it.incident_id) + _lark_escape(_item_header(it, lb))]
        if it.evidence:
            lines.append(f"**{lb['evidence']}**")
            lines += [f"- {_lark_escape(e)}" for e in it.evidence]
        if it.fix:
            lines.append(f"**{lb['fix']}**: {_lark_escape(it.fix)}")
        if it.repro:
            lines.append(f"**{lb['repro']}**: `{it.repro}`")
        elements.append({"tag": "div", "text": {"tag": "lark_md", "content": "\n".join(lines)}})
        elements.append({"tag": "hr"})
    if msg.notes:
        elements.append({"tag": "note", "elements": [{"tag": "plain_text", "content": n} for n in msg.notes]})
    return {
        "config": {"wide_screen_mode": True},
        "header": {"template": "orange" if msg.abstained else "blue",
                   "title": {"tag": "plain_text", "content": msg.heading}},
        "elements": elements,
    }


def feishu_reply_body(msg: Message) -> dict:
    return {"msg_type": "interactive", "content": json.dumps(to_feishu_card(msg), ensure_ascii=False)}


# ---------------------------------------------------------------- DingTalk markdown
_MD_SPECIAL = re.compile(r"([\\`*_\[\]#])")


def _md_escape(text: str) -> str:
    return _MD_SPECIAL.sub(r"\\\1", text)


def to_dingtalk(msg: Message) -> dict:
    """A robot reply {"msgtype": "markdown", ...} (DingTalk renders a markdown subset)."""
    lb = msg.labels
    out = [f"### {_md_escape(msg.heading)}"]
    for i, it in enumerate(msg.items, 1):
        out.append(f"**{i}. {_md_escape(it.title)}**  \n{_code(it.incident_id)}{_md_escape(_item_header(it, lb))}")
        if it.evidence:
            out.append(f"**{lb['evidence']}**\n\n" + "\n".join(f"- {_md_escape(e)}" for e in it.evidence))
        if it.fix:
            out.append(f"**{lb['fix']}**: {_md_escape(it.fix)}")
        if it.repro:
            out.append(f"**{lb['repro']}**: `{it.repro}`")
    out += [f"> {_md_escape(n)}" for n in msg.notes]
    return {"msgtype": "markdown", "markdown": {"title": msg.heading, "text": "\n\n".join(out)}}


def busy_message(retry_after_s: int) -> Message:
    """Said in chat when the server's admission cap is full (the HTTP answer would be 503)."""
    return Message(heading="The knowledge base is busy", abstained=True,
                   notes=[f"Too many questions at once; ask again in {retry_after_s} s."])
