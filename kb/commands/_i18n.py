"""Every label, header and message the CLI prints, in English and Chinese (`--lang`, or the input's language)."""

from __future__ import annotations

import os

MESSAGES: dict[str, tuple[str, str]] = {
    # table headers
    "h.id": ("id", "编号"), "h.title": ("title", "标题"), "h.framework": ("framework", "框架"),
    "h.algorithm": ("algorithm", "算法"), "h.category": ("category", "类别"), "h.score": ("score", "相关度"),
    "h.conf": ("conf", "置信度"), "h.incident": ("incident", "事件"), "h.lang": ("lang", "语言"),
    "h.status": ("status", "状态"), "h.field": ("field", "字段"), "h.value": ("value", "值"),
    "h.incidents": ("incidents", "事件数"), "h.language": ("language", "语言"), "h.path": ("path", "路径"),
    "h.verdict": ("verdict", "结论"), "h.reproduced": ("reproduced", "复现"), "h.fixed": ("fixed", "修复后"),
    "h.trigger": ("trigger", "触发"), "h.device": ("device", "设备"), "h.faulty_run": ("faulty run", "故障运行"),
    "h.fixed_run": ("fixed run", "修复运行"), "h.framework_level": ("framework level", "框架级"),
    "h.seconds": ("s", "秒"), "h.note": ("error / note", "错误 / 备注"),
    # labels
    "l.evidence": ("evidence", "证据"), "l.fix": ("fix", "修复"), "l.repro": ("repro", "复现"),
    "l.decided_by": ("decided by", "判定依据"), "l.facts": ("facts", "事实"), "l.warning": ("warning", "警告"),
    "l.error": ("error", "错误"), "l.sources": ("Sources", "来源"), "l.root_cause": ("Root cause", "根因"),
    "l.reported": ("reported", "报告版本"), "l.affected": ("affected", "受影响"), "l.fixed_in": ("fixed", "已修复"),
    "l.model_algorithm": ("model / algorithm", "模型 / 算法"),
    "l.precision_parallelism": ("precision / parallelism", "精度 / 并行"),
    "l.category_status": ("category / status", "类别 / 状态"), "l.config": ("config", "配置"),
    "l.language_origin": ("language / origin", "语言 / 来源"),
    # states
    "s.confirmed": ("confirmed", "已确认"), "s.not_confirmed": ("not confirmed", "未确认"),
    "s.needs_gpu": ("needs GPU", "需要 GPU"), "s.error": ("ERROR", "出错"), "s.yes": ("yes", "是"),
    "s.no": ("no", "否"),
    # messages
    "m.no_match": ("No incident matches.", "没有匹配的事件。"),
    "m.abstain_ask": ("Nothing in the knowledge base fits well; closest candidates:",
                      "知识库中没有足够匹配的事件，以下为最接近的候选："),
    "m.abstain_diag": ("No confident diagnosis: ", "无法给出可靠诊断："),
    "m.closest": ("Closest candidates:", "最接近的候选："),
    "m.n_incidents": ("{n} incident(s)", "共 {n} 个事件"),
    "m.stats_head": ("{records} incidents, {repro} with a repro check", "{records} 个事件，其中 {repro} 个有复现检查"),
    "m.index": ("index: {info}", "索引：{info}"),
    "m.checked": ("{n} document(s) checked, {bad} failed", "检查了 {n} 个文档，{bad} 个未通过"),
    "m.indexed": ("indexed {records} records ({rows} rows) with {model} [{kind}] -> {path}",
                  "已索引 {records} 条记录（{rows} 行），模型 {model} [{kind}] -> {path}"),
    "m.indexing": ("indexing", "建立索引"), "m.repro_all": ("repro checks", "复现检查"),
    "m.ingesting": ("ingesting", "导入"),
    "m.gate_hit": (("pre-flight: {what} matches a known failure: {category} ({incident}) at confidence "
                    "{conf:.2f} >= {threshold:.2f}"),
                   "起飞前检查：{what} 命中已知故障 {category}（{incident}），置信度 {conf:.2f} >= {threshold:.2f}"),
    "m.gate_ok": ("pre-flight: no known failure at confidence >= {threshold:.2f} (best: {best})",
                  "起飞前检查：没有置信度 >= {threshold:.2f} 的已知故障（最高：{best}）"),
    "m.bisect": ("bisect plan (switch off or roll back, in order):", "排查顺序（逐项关闭或回退）："),
    "m.candidates": ("candidates: ", "候选："),
    "m.unsure_ask": ("not settled yet: answering these would tell the candidates apart:",
                     "尚不能确定：回答下面的问题可以区分这些候选原因："),
    "m.track_record": (("answers this confident ({band}) were right {pct:.0f} % of the time: {reports} of {of} real "
                        "reports it had not seen fell in that band"),
                       "置信度在 {band} 的回答有 {pct:.0f}% 是对的：{of} 份未见过的真实报告中有 {reports} 份落在这一档"),
    "m.seen_in": ("seen in {n} similar real report(s):", "在 {n} 个相似的真实报告中见过："),
    "m.similar_other": ("similar real reports (none of them with this cause):",
                        "相似的真实报告（原因都与此不同）："),
    "m.did_you_mean": ("did you mean {options}?", "你是不是想找 {options}？"),
    "m.unknown_value": ("unknown {what} {value!r}", "未知的{what} {value!r}"),
    "m.known_values": ("known: {values}", "可选：{values}"),
    "w.framework": ("framework", "框架"), "w.algorithm": ("algorithm", "算法"), "w.category": ("category", "类别"),
    "w.incident": ("incident", "事件"),
}


def env_lang() -> str:
    """The user's language from KB_LANG, then the locale (LC_ALL, LC_MESSAGES, LANG): zh or en."""
    for var in ("KB_LANG", "LC_ALL", "LC_MESSAGES", "LANG"):
        v = os.environ.get(var, "")
        if v:
            return "zh" if v.lower().startswith("zh") else "en"
    return "en"


def t(key: str, lang: str, **kw: object) -> str:
    en, zh = MESSAGES[key]
    text = zh if lang == "zh" else en
    return text.format(**kw) if kw else text
