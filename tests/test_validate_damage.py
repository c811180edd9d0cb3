"""`kb validate` catches text the YAML parser accepts but damages: comment cuts and truncated prose."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kb.documents import lint_front_matter, parse_incident_md

REPO = Path(__file__).resolve().parent.parent
ORPO = REPO / "incidents" / "trl-orpo-log1p-backward-nan" / "incident.md"


def _damage(text: str) -> str:
    """Re-create the original defect: the quoted fix summary unquoted, so ` #4763` starts a comment."""
    good = "    en: 'Upgrade TRL to a build with PR #4763 (fp32 + stable log1mexp)"
    assert good in text
    start = text.index(good)
    end = text.index("\n", start)
    line = text[start:end]
    return text[:start] + line.replace("en: '", "en: ", 1)[:-1] + text[end:]


def test_every_shipped_incident_is_clean():
    for p in sorted((REPO / "incidents").glob("*/incident.md")):
        assert lint_front_matter(p.read_text(encoding="utf-8"), source=str(p)) == []


def test_orpo_fix_summary_is_whole_in_both_languages():
    inc = parse_incident_md(ORPO.read_text(encoding="utf-8"))
    assert "#4763" in inc.fix.summary.en and inc.fix.summary.en.endswith("(1.16.0 still needs this).")
    assert "#4763" in inc.fix.summary.zh and inc.fix.summary.zh.endswith("（1.16.0 仍需如此）。")
    assert all("#4763" in s.en and "#4763" in s.zh for s in inc.fix.steps[:1])


def test_comment_cut_is_detected_with_its_line():
    bad = _damage(ORPO.read_text(encoding="utf-8"))
    inc = parse_incident_md(bad)  # the parser alone accepts it ...
    assert inc.fix.summary.en == "Upgrade TRL to a build with PR"
    problems = lint_front_matter(bad, source="x.md")  # ... the lint does not
    assert len(problems) == 1
    assert "cut by a YAML comment" in problems[0] and "'#4763" in problems[0] and "line 91" in problems[0]


def test_truncated_prose_and_unclosed_bracket_are_detected():
    text = ("---\nid: x\ntitle:\n  en: NaN loss with half precision and the\n  zh: 标题\nroot_cause:\n  explanation:\n"
            "    en: 'The scale overflows (see the log'\n    zh: 溢出\nconfig:\n  fp16: true  # a real comment\n---\n")
    problems = lint_front_matter(text)
    assert any("en looks truncated" in p and "line 4" in p for p in problems), problems
    assert any("unclosed '('" in p for p in problems), problems
    assert len(problems) == 2  # a comment after a single token is fine


def test_kb_validate_fails_on_the_damaged_document(tmp_path):
    folder = tmp_path / "incidents" / "trl-orpo-log1p-backward-nan"
    folder.mkdir(parents=True)
    (folder / "incident.md").write_text(_damage(ORPO.read_text(encoding="utf-8")), encoding="utf-8")
    (folder / "repro.py").write_text((ORPO.parent / "repro.py").read_text(encoding="utf-8"), encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "kb.cli", "--incidents-dir", str(tmp_path / "incidents"),
                        "--data-dir", str(tmp_path / "data"), "validate"], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cut by a YAML comment" in r.stdout
    ok = subprocess.run([sys.executable, "-m", "kb.cli", "--data-dir", str(tmp_path / "data"), "validate",
                         str(ORPO)], capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
