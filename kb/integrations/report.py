"""Acting on a run-time diagnosis: the printed report, <output_dir>/kb-diagnosis.json (the JSON of
`kb diagnose --json`) and a post to a Slack / Feishu (Lark) / DingTalk incoming webhook."""

from __future__ import annotations

import json
import os
import re
import tempfile
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kb.diagnose.models import Diagnosis
    from kb.integrations.collect import Collected

REPORT_FILE = "kb-diagnosis.json"
MAX_EVIDENCE = 6


def format_report(diag: Diagnosis, collected: Collected | None = None, k: int = 3) -> str:
    zh = diag.lang == "zh"
    out = ["=" * 72, "kb: training went wrong" + (f": {collected.trigger}" if collected and collected.trigger else "")]
    if diag.abstained:
        out.append(("无法给出可靠诊断：" if zh else "No confident diagnosis: ") + diag.reason)
    for i, d in enumerate(diag.diagnoses[:k], 1):
        out.append(f"{i}. {d.category} ({d.confidence:.2f}) — {d.incident_id or d.title}")
        if d.incident_id:
            out.append(f"   {d.title}")
        if d.decided_by:  # line numbers point into the rendered facts, which the user never sees
            out.append(f"   decided by: {re.sub(r' [(]line [0-9]+[)]', '', d.decided_by)}")
        for e in d.evidence[:MAX_EVIDENCE]:
            out.append(f"   [{e.kind}] {e.detail}")
        if d.fix:
            out.append(f"   fix: {d.fix}")
        if d.repro:
            out.append(f"   repro: {d.repro}")
    if collected is not None:
        findings = collected.facts.get("findings", ([], ""))[0]
        if findings:
            out.append("probe:")
            out += [f"   {f.lstrip('# ')}" for f in findings]
    out.append("=" * 72)
    return "\n".join(out)


def write_json(diag: Diagnosis, output_dir: str | Path) -> Path:
    """Atomic write, so that a run killed mid-write leaves either the old file or the new one."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / REPORT_FILE
    data = json.dumps(diag.model_dump(mode="json"), ensure_ascii=False, indent=2)
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".kb-diagnosis.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(data + "\n")
    os.replace(tmp, path)
    return path


def webhook_kind(url: str) -> str:
    u = url.lower()
    if "feishu" in u or "larksuite" in u or "/open-apis/bot/" in u:
        return "feishu"
    if "dingtalk" in u or "oapi.dingtalk" in u:
        return "dingtalk"
    return "slack"


def webhook_body(kind: str, diag: Diagnosis, collected: Collected | None = None) -> dict:
    """The body each platform's incoming webhook takes, carrying the plain-text report."""
    text = format_report(diag, collected).replace("=" * 72 + "\n", "").replace("\n" + "=" * 72, "")
    title = "kb: " + (diag.diagnoses[0].category if diag.diagnoses and not diag.abstained else "no confident diagnosis")
    if kind == "feishu":
        return {"msg_type": "text", "content": {"text": text}}
    if kind == "dingtalk":
        return {"msgtype": "markdown", "markdown": {"title": title, "text": "```\n" + text + "\n```"}}
    return {"text": "```" + text + "```"}


def post_webhook(url: str, diag: Diagnosis, collected: Collected | None = None, kind: str | None = None,
                 timeout: float = 10.0) -> int:
    kind = kind or webhook_kind(url)
    body = json.dumps(webhook_body(kind, diag, collected), ensure_ascii=False).encode("utf-8")
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # the user's own webhook URL
        return resp.status
