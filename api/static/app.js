// The paste page: sends the paste to /v1/diagnose and shows the diagnosis, with evidence lines marked in the paste.
// The differential questions are answered in place: an answer is sent with the same paste (the request's "facts")
// and the ranking is redone with every answer given so far; a new paste starts over.
"use strict";

const I18N = {
  en: {
    title: "kb — why did my loss go NaN?",
    subtitle: "Paste a training log, a config or a command line (or all of them), or drop a file.",
    api_docs: "API docs", drop_hint: "…or drop a log / config file here", choose_file: "Choose files",
    example: "Example", diagnose: "Diagnose", questions: "To tell the candidates apart",
    your_paste: "Your paste (evidence lines highlighted)", facts: "Facts read from the paste",
    footer: "Runs on this server only; nothing is sent anywhere else.",
    placeholder: "{'loss': nan, 'grad_norm': nan, 'epoch': 0.02}\nrlhf_type: dpo\nsequence_parallel_size: 4",
    empty: "Paste a log, a config or a command line first.", working: "Diagnosing…",
    diagnosed: "Most likely cause", abstained: "No confident diagnosis", candidates: "Closest candidates",
    confidence: "confidence", evidence: "Evidence", fix: "Fix", repro: "Confirm it", decided_by: "Decided by",
    line: "line", copy: "Copy", copied: "Copied", incident: "incident", error: "Error",
    loaded: "Loaded", no_hits: "No line of the paste was used as evidence.",
    track: (r, pct) => `Answers this confident (${r.band}) were right ${pct}% of the time: ${r.reports} of ${r.of} ` +
      "real reports kb had not seen fell in that band.",
    answered: "Your answers (the ranking is redone with them)", answer: "Answer", your_answer: "your answer",
    remove: "Remove this answer", reranking: "Re-ranking with your answers…",
  },
  zh: {
    title: "kb —— 训练 loss 为什么变成 NaN？",
    subtitle: "粘贴训练日志、配置或启动命令（也可以一起粘贴），或拖入文件。",
    api_docs: "API 文档", drop_hint: "……或把日志 / 配置文件拖到这里", choose_file: "选择文件",
    example: "示例", diagnose: "诊断", questions: "用来区分候选原因的问题",
    your_paste: "你的输入（证据所在行已高亮）", facts: "从输入中读出的事实",
    footer: "只在本服务器上运行，不会发送到其他任何地方。",
    placeholder: "{'loss': nan, 'grad_norm': nan, 'epoch': 0.02}\nrlhf_type: dpo\nsequence_parallel_size: 4",
    empty: "请先粘贴日志、配置或命令行。", working: "正在诊断……",
    diagnosed: "最可能的原因", abstained: "无法给出可靠诊断", candidates: "最接近的候选",
    confidence: "置信度", evidence: "证据", fix: "修复", repro: "复现确认", decided_by: "判定依据",
    line: "行", copy: "复制", copied: "已复制", incident: "事件", error: "错误",
    loaded: "已载入", no_hits: "输入中没有哪一行被用作证据。",
    track: (r, pct) => `置信度在 ${r.band} 的回答有 ${pct}% 是对的：${r.of} 份 kb 没见过的真实报告中有 ${r.reports} 份落在这一档。`,
    answered: "你的回答（已据此重新排序）", answer: "回答", your_answer: "你的回答",
    remove: "删除这个回答", reranking: "正在根据你的回答重新排序……",
  },
};

const EXAMPLE = [
  "swift rlhf --rlhf_type dpo --model Qwen/Qwen2.5-7B-Instruct --rpo_alpha 1.0 \\",
  "    --sequence_parallel_size 4 --deepspeed zero3 --torch_dtype bfloat16",
  "{'loss': 0.6931, 'grad_norm': 1.02, 'learning_rate': 1e-06, 'rewards/chosen': 0.0, 'epoch': 0.01}",
  "{'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-06, 'nll_loss': nan, 'rewards/chosen': nan, 'epoch': 0.02}",
].join("\n");

function pickLang() {
  const server = document.documentElement.dataset.lang;  // from Accept-Language, set by the server
  const nav = (navigator.languages && navigator.languages[0]) || navigator.language || "en";
  return (server || nav).toLowerCase().startsWith("zh") ? "zh" : "en";
}
const LANG = pickLang();
const T = I18N[LANG];
document.documentElement.lang = LANG === "zh" ? "zh-CN" : "en";

function translatePage() {
  document.title = T.title;
  for (const el of document.querySelectorAll("[data-i18n]")) el.textContent = T[el.dataset.i18n];
  for (const el of document.querySelectorAll("[data-i18n-placeholder]")) el.placeholder = T[el.dataset.i18nPlaceholder];
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

const $ = (id) => document.getElementById(id);

function setStatus(text, isError) {
  $("status").textContent = text || "";
  $("status").classList.toggle("error", !!isError);
}

async function readFiles(files) {
  const parts = [];
  for (const f of files) parts.push(await f.text());
  const box = $("paste");
  box.value = [box.value.trim(), ...parts.map((p) => p.trim())].filter(Boolean).join("\n");
  $("files").textContent = `${T.loaded}: ${[...files].map((f) => f.name).join(", ")}`;
}

function copyButton(text) {
  const b = el("button", { type: "button", class: "secondary copy", text: T.copy });
  b.addEventListener("click", async () => {
    try { await navigator.clipboard.writeText(text); b.textContent = T.copied; } catch (_) { /* no clipboard */ }
  });
  return b;
}

function questionText(q) {
  if (typeof q === "string") return q;
  if (!q || typeof q !== "object") return String(q);
  const v = q.question || q.text || q[LANG] || q.en || q.zh || "";
  return typeof v === "object" ? (v[LANG] || v.en || v.zh || "") : String(v);
}

// What the result on screen was diagnosed from: the paste and the answers given to its questions so far.
let shown = { paste: "", answers: {} };

function questionItem(q) {
  const li = el("li", { "data-fact": q.fact || "" }, el("span", { class: "q", text: questionText(q) }));
  if (!q || !q.fact) return li;  // a question with nothing to answer it by: shown, not answerable here
  const row = el("div", { class: "answer-row" });
  const give = (value) => answer(q.fact, value);
  if ((q.options || []).length) {
    for (const o of q.options) {
      const b = el("button", { type: "button", class: "secondary answer", "data-value": String(o), text: String(o) });
      b.addEventListener("click", () => give(String(o)));
      row.append(b);
    }
  } else {  // an open question (a version, a learning rate): a short line of text
    const input = el("input", { type: "text", class: "answer-text", maxlength: "200", placeholder: T.your_answer,
                                "aria-label": questionText(q) });
    const b = el("button", { type: "button", class: "secondary answer", text: T.answer });
    const go = () => { if (input.value.trim()) give(input.value.trim()); };
    b.addEventListener("click", go);
    input.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); go(); } });
    row.append(input, b);
  }
  li.append(row);
  return li;
}

function renderAnswers(answers) {
  const keys = Object.keys(answers);
  $("answered").hidden = !keys.length;
  $("answer-list").replaceChildren(...keys.map((key) => {
    const x = el("button", { type: "button", class: "secondary remove", title: T.remove, "aria-label": T.remove,
                             text: "×" });
    x.addEventListener("click", () => {
      const rest = { ...shown.answers };
      delete rest[key];
      diagnose(shown.paste, rest);
    });
    return el("li", { "data-fact": key }, el("code", { text: `${key} = ${answers[key]}` }), x);
  }));
}

function answer(fact, value) {
  diagnose(shown.paste, { ...shown.answers, [fact]: value });
}

function renderLines(paste, hits) {
  const ol = $("lines");
  ol.replaceChildren();
  paste.replace(/\n+$/, "").split("\n").forEach((line, i) => {
    const li = el("li", { id: `L${i + 1}` }, line || " ");
    const why = hits.get(i + 1);
    if (why) {
      li.classList.add("hit");
      li.title = why.join("\n");
      const more = why.length > 3 ? ` (+${why.length - 3})` : "";
      li.append(el("span", { class: "why", text: "← " + why.slice(0, 3).join(" · ") + more }));
    }
    ol.append(li);
  });
}

// The engine quotes the evidence line in its detail; the line is highlighted in the paste, so drop the quote.
function shortDetail(e, pasteLines) {
  if (!e.line) return e.detail;
  const cut = e.detail.indexOf(" — ");
  if (cut > 0) return e.detail.slice(0, cut);
  const text = (pasteLines[e.line - 1] || "").trim();
  if (text.length < 8 || !e.detail.includes(text)) return e.detail;
  return e.detail.replace(text, "").replace(/[\s—:-]+$/, "") || e.detail;
}

function render(res, paste) {
  const pasteLines = paste.split("\n");
  const hits = new Map();
  const diags = res.diagnoses || [];
  // Marks come from the leading diagnosis (all of them when abstaining): the lines that decided it.
  (res.abstained ? diags : diags.slice(0, 1)).forEach((d) => (d.evidence || []).forEach((e) => {
    if (e.line && (!e.source || e.source === "text" || e.source === "paste")) {
      if (!hits.has(e.line)) hits.set(e.line, []);
      const list = hits.get(e.line);
      const short = shortDetail(e, pasteLines);
      if (!list.includes(short)) list.push(short);
    }
  }));

  const summary = $("summary");
  summary.className = "summary" + (res.abstained ? " abstained" : "");
  summary.replaceChildren();
  if (res.abstained) {
    summary.append(el("strong", { text: T.abstained }), res.reason ? `: ${res.reason}` : "");
  } else if (diags.length) {
    summary.append(el("strong", { text: `${T.diagnosed}: ` }), el("code", { text: diags[0].category }),
                   ` — ${diags[0].title}`);
  }
  // How often answers this confident were right on reports kb had not seen (out of fold on its case base).
  const rec = res.track_record;
  if (rec) summary.append(el("div", { id: "track", class: "muted", text: T.track(rec, rec.percent) }));

  const qs = res.questions || res.differential_questions || res.differential || [];
  $("questions").hidden = !qs.length;
  $("question-list").replaceChildren(...qs.map(questionItem));

  const box = $("diagnoses");
  box.replaceChildren();
  if (res.abstained && diags.length) box.append(el("h2", { text: T.candidates }));
  diags.forEach((d, i) => {
    const pct = Math.round((d.confidence || 0) * 100);
    const card = el("div", { class: "card diagnosis", "data-category": d.category, "data-incident": d.incident_id });
    card.append(el("h3", {}, `${i + 1}. `, el("code", { text: d.category }), ` — ${d.title}`));
    const meta = el("div", { class: "meta" }, `${T.confidence}`,
                    el("span", { class: "conf" }, el("i", { style: `width:${pct}%` })), `${pct}%`);
    if (d.incident_id) meta.append(`  ·  ${T.incident}: `, el("code", { text: d.incident_id }));
    card.append(meta);
    if (d.decided_by) card.append(el("div", {}, el("span", { class: "label", text: `${T.decided_by}:` }), d.decided_by));
    if ((d.evidence || []).length) {
      card.append(el("div", { class: "label", text: T.evidence }));
      const ul = el("ul", { class: "evidence" });
      for (const e of d.evidence.slice(0, 6)) {
        const li = el("li", {});
        if (e.line) {
          const a = el("a", { class: "ev-line", href: `#L${e.line}`, text: `[${e.source || "text"} ${T.line} ${e.line}]` });
          a.addEventListener("click", () => {
            const target = $(`L${e.line}`);
            if (target) { target.classList.add("flash"); setTimeout(() => target.classList.remove("flash"), 1200); }
          });
          li.append(a, " ");
        } else {
          li.append(el("span", { class: "muted", text: `[${e.kind}] ` }));
        }
        li.append(shortDetail(e, pasteLines));
        ul.append(li);
      }
      card.append(ul);
    }
    if (d.fix) card.append(el("div", { class: "fix" }, el("span", { class: "label", text: `${T.fix}:` }), d.fix));
    if (d.repro) card.append(el("div", {}, el("span", { class: "label", text: `${T.repro}:` }),
                                el("span", { class: "cmd repro", text: d.repro }), copyButton(d.repro)));
    box.append(card);
  });

  renderLines(paste, hits);
  $("lines").dataset.hits = String(hits.size);
  const facts = res.facts || {};
  $("facts").textContent = Object.entries(facts)
    .map(([k, v]) => `${k} = ${JSON.stringify(v && typeof v === "object" && "value" in v ? v.value : v)}`).join("\n");
  $("facts-box").hidden = !Object.keys(facts).length;
  $("result").hidden = false;
  setStatus(hits.size ? "" : T.no_hits);
}

function busy(on) {
  for (const b of document.querySelectorAll("#submit, #result button.answer, #result button.remove")) b.disabled = on;
}

// A paste alone goes as text/plain; with answers, as JSON {text, facts} (the same reading of the paste). A refused
// answer (an unknown word) leaves the result on screen as it was, with the error above it.
async function diagnose(paste, answers) {
  const answering = Object.keys(answers).length > 0;
  busy(true);
  setStatus(answering ? T.reranking : T.working);
  const headers = { "accept-language": LANG };
  let body = paste;
  if (answering) {
    headers["content-type"] = "application/json";
    body = JSON.stringify({ text: paste, k: 3, facts: answers });
  } else {
    headers["content-type"] = "text/plain; charset=utf-8";
  }
  try {
    const r = await fetch("/v1/diagnose?k=3", { method: "POST", headers, body });
    const res = await r.json().catch(() => ({}));
    if (!r.ok) {
      const msg = (res.error && res.error.message) || `HTTP ${r.status}`;
      setStatus(`${T.error}: ${msg}`, true);
      if (paste !== shown.paste) $("result").hidden = true;
      return;
    }
    shown = { paste, answers };
    render(res, paste);
    renderAnswers(answers);
  } catch (e) {
    setStatus(`${T.error}: ${e}`, true);
  } finally {
    busy(false);
  }
}

function submit(ev) {
  ev.preventDefault();
  const paste = $("paste").value;
  if (!paste.trim()) { setStatus(T.empty, true); return; }
  diagnose(paste, {});  // a paste diagnosed anew starts over: no answers carried from the last one
}

function wireDrop() {
  const zone = $("drop");
  ["dragenter", "dragover"].forEach((t) => zone.addEventListener(t, (e) => { e.preventDefault(); zone.classList.add("over"); }));
  ["dragleave", "drop"].forEach((t) => zone.addEventListener(t, (e) => { e.preventDefault(); zone.classList.remove("over"); }));
  zone.addEventListener("drop", (e) => { if (e.dataTransfer.files.length) readFiles(e.dataTransfer.files); });
  $("file").addEventListener("change", (e) => readFiles(e.target.files));
}

translatePage();
wireDrop();
$("form").addEventListener("submit", submit);
$("example").addEventListener("click", () => { $("paste").value = EXAMPLE; $("paste").focus(); });
document.body.dataset.ready = "1";
