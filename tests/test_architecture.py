"""The layers hold: no import cycle anywhere in kb/ and api/, the library never imports the HTTP layer or the CLI,
and the same text read as an article and as a paste yields the same facts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in ("kb", "api"):
        for p in (ROOT / pkg).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> first-party modules it imports (at any depth of the file, function-level imports included).

    `from a.b import c` is an edge to `a.b.c` when that is a module, else to `a.b`; the implicit import of a
    parent package's __init__ is not an edge (Python initialises parents first, so it cannot form a cycle
    by itself)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_kb_and_api():
    found = cycles(import_graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_library_never_imports_the_http_layer_or_the_cli():
    bad = [(m, t) for m, ts in import_graph().items() if m.startswith("kb") and not m.startswith("kb.commands")
           and m not in ("kb.cli", "kb.__main__") for t in ts if t.startswith(("api", "kb.commands", "kb.cli"))]
    assert bad == []


# --- one fact layer: an article and a paste with the same text give the same facts ----------------------------
def _seed_texts() -> list[tuple[str, str]]:
    from kb.paths import shared_dir

    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared is not beside the checkout")
    return [(p.name, p.read_text(encoding="utf-8")) for p in sorted((shared / "seeds").glob("*.txt"))]


def test_seed_articles_give_the_same_settings_as_the_same_text_pasted():
    """A raw article's record config is exactly the setting facts a paste of its reported text yields."""
    from kb.facts import extract_facts
    from kb.ingest import parse_document
    from kb.ingest.parse import record_config

    texts = _seed_texts()
    assert len(texts) == 5
    with_settings = 0
    for name, text in texts:
        result = parse_document(text, name=name)
        pasted = record_config(extract_facts(result.reported_text))
        assert result.incident.config == pasted, name
        with_settings += bool(pasted)
    assert with_settings >= 4  # seed 002 states only a relation (max_prompt_length == max_length)


def test_real_pastes_give_the_same_facts_as_articles():
    """Real reporters' pastes (the dev set), ingested as an article or diagnosed as a paste: same settings."""
    import json

    from kb.facts import extract_facts
    from kb.ingest import parse_document
    from kb.ingest.parse import record_config
    from kb.paths import shared_dir

    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared is not beside the checkout")
    rows = [json.loads(x) for x in (shared / "eval" / "dev.jsonl").read_text(encoding="utf-8").splitlines() if x]
    compared = 0
    for row in rows:
        article = "# report\n\n" + row["query"]
        result = parse_document(article, name="report.md")
        assert result.incident.config == record_config(extract_facts(result.reported_text)), row["id"]
        compared += bool(result.incident.config)
    assert compared >= 10


# --- incident.md is the single source of each repro check -----------------------------------------------------
RECORD_OWNED = ("incident_id", "defaults", "gpu_only_effect", "triggers")


def test_every_incident_and_its_check_agree():
    """Each check is bound to the incident.md beside it and takes id, defaults, GPU flag and trigger from it; a
    check file defines only the mechanism (no attribute the record owns), and its settings are canonical keys."""
    from kb.canonical import spec
    from kb.documents import load_incidents
    from kb.repro.harness import ReproCheck, load_check

    records, problems = load_incidents(ROOT / "incidents")
    assert not problems
    with_check = [r for r in records if r.repro.path]
    assert len(with_check) >= 40
    for rec in with_check:
        path = ROOT / "incidents" / rec.id / rec.repro.path
        cls = load_check(path)
        owned = [a for a in RECORD_OWNED if a in vars(cls)]
        assert owned == [], f"{rec.id}: repro.py defines {owned}; they belong in incident.md"
        check = cls()
        assert check.incident_id == rec.id and check.gpu_only_effect == rec.repro.gpu_only
        assert check.defaults == {**({"algorithm": rec.algorithm} if rec.algorithm != "unknown" else {}),
                                  **rec.config, **rec.repro.settings}
        unknown = [k for k in rec.repro.settings if spec(k) is None]
        assert unknown == [], f"{rec.id}: repro.settings keys that are not canonical: {unknown}"
        assert ReproCheck.triggers is type(check).triggers, rec.id
