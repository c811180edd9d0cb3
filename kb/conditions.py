"""The one condition language: `Condition`s and `Trigger`s (kb.records) evaluated over canonical `Facts`.

Used by ingest (category cues), diagnosis (ranking) and repro checks (does the user's setting trigger it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from kb.canonical import normalise_value, parse_number, spec
from kb.facts.model import Fact, Facts
from kb.facts.prefilter import fold_cached, requirement, satisfied
from kb.records import Condition, Trigger

_VERSIONISH = re.compile(r"^v?\d+(?:\.\d+)+")


def _version_tuple(v: Any) -> tuple[int, ...] | None:
    m = _VERSIONISH.match(str(v).strip())
    if not m:
        return None
    return tuple(int(x) for x in m.group(0).lstrip("v").split("."))


def normalised(fact_key: str, v: Any) -> Any:
    """The expected value in the fact's canonical form (`float16` -> `fp16`), strings lowercased."""
    s = spec(fact_key)
    if s is not None and s.kind not in ("list", "version") and v is not None and not isinstance(v, (list, dict)):
        nv = normalise_value(fact_key, v)
        v = v if nv is None else nv
    return v.lower() if isinstance(v, str) else v


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    na, nb = parse_number(a), parse_number(b)
    if na is not None and nb is not None:
        return math.isclose(na, nb)
    return str(a).lower() == str(b).lower()


def _cmp(a: Any, b: Any) -> int | None:
    va, vb = _version_tuple(a), _version_tuple(b)
    if va is not None and vb is not None and (isinstance(a, str) or isinstance(b, str)):
        n = max(len(va), len(vb))
        va, vb = va + (0,) * (n - len(va)), vb + (0,) * (n - len(vb))
        return (va > vb) - (va < vb)
    na, nb = parse_number(a), parse_number(b)
    if na is None or nb is None:
        return None
    return (na > nb) - (na < nb)


def _element_match(el: Any, want: Any) -> bool:
    e, w = str(el).lower(), str(want).lower()
    return e == w or e.rsplit("/", 1)[-1] == w or e.endswith("/" + w)


def check(cond: Condition, facts: Facts) -> tuple[bool, Fact | None]:
    """Whether `cond` holds, and the fact that decided it. Unknown facts make every op but `absent` false."""
    f = facts.get(cond.fact)
    if cond.op == "absent":
        return f is None or f.value in (None, [], ""), None
    if f is None or f.value in (None, [], ""):
        return False, None
    have = f.value
    if cond.value_fact is not None:
        other = facts.get(cond.value_fact)
        if other is None:
            return False, None
        want: Any = other.value
    elif cond.op == "regex":
        # A pattern is matched case-insensitively as written: lowercasing it would turn \W, \S, \D or \B into
        # their opposites.
        want = cond.value
    else:
        want = normalised(cond.fact, cond.value)
    op = cond.op
    ok = False
    if op == "present":
        ok = True
    elif op == "truthy":
        ok = bool(have) and str(have).lower() not in ("false", "0", "none")
    elif op == "falsy":
        ok = not have or str(have).lower() in ("false", "0", "none")
    elif op in ("eq", "ne"):
        same = any(_element_match(x, want) for x in have) if isinstance(have, list) else same_value(have, want)
        ok = same if op == "eq" else not same
    elif op in ("gt", "ge", "lt", "le"):
        c = _cmp(have, want)
        ok = c is not None and {"gt": c > 0, "ge": c >= 0, "lt": c < 0, "le": c <= 0}[op]
    elif op == "in":
        options = want if isinstance(want, (list, tuple, set)) else [want]
        options = [normalised(cond.fact, o) for o in options]
        if isinstance(have, list):
            ok = any(_element_match(x, o) for x in have for o in options)
        else:
            ok = any(same_value(have, o) for o in options)
    elif op == "contains":
        if isinstance(have, list):
            ok = any(_element_match(x, want) for x in have)
        else:
            ok = str(want).lower() in str(have).lower()
    elif op == "regex":
        text = " ".join(map(str, have)) if isinstance(have, list) else str(have)
        try:
            rx = re.compile(str(want), re.IGNORECASE)
        except re.error:
            rx = None
        # Over a whole article (ingest's category cues) a substring test rules most patterns out first.
        ok = rx is not None and satisfied(requirement(rx.pattern, rx.flags), fold_cached(text)) and rx.search(text) is not None
    if ok and isinstance(have, list) and op in ("eq", "in", "contains"):
        for el in have:
            e = facts.evidence_for(cond.fact, el)
            if e is not None and (op != "in" or any(_element_match(el, o) for o in want)
                                  if isinstance(want, list) else _element_match(el, want)):
                return True, e
    return ok, f if ok else None


def describe(cond: Condition) -> str:
    rhs = cond.value_fact if cond.value_fact else ("" if cond.op in ("present", "absent", "truthy", "falsy")
                                                   else repr(cond.value))
    return f"{cond.fact} {cond.op} {rhs}".strip()


@dataclass
class TriggerResult:
    trigger: Trigger
    fired: bool
    matched: list[tuple[Condition, Fact | None]] = field(default_factory=list)
    blocked_by: list[tuple[Condition, Fact | None]] = field(default_factory=list)
    fraction: float = 0.0  # share of all/any requirements met, for partial credit


def evaluate_trigger(t: Trigger, facts: Facts) -> TriggerResult:
    res = TriggerResult(t, False)
    need, met = 0, 0
    all_ok = True
    for c in t.all:
        need += 1
        ok, f = check(c, facts)
        if ok:
            met += 1
            res.matched.append((c, f))
        else:
            all_ok = False
    any_ok = not t.any
    if t.any:
        need += 1
        for c in t.any:
            ok, f = check(c, facts)
            if ok:
                res.matched.append((c, f))
                if not any_ok:
                    met += 1
                any_ok = True
    for c in t.none:
        ok, f = check(c, facts)
        if ok:
            res.blocked_by.append((c, f))
    res.fraction = met / need if need else 0.0
    res.fired = all_ok and any_ok and not res.blocked_by and need > 0
    return res


def decide(triggers: list[Trigger], facts: Facts) -> tuple[bool | None, str]:
    """Do these facts trigger the incident? True when a trigger fires; False when every trigger is ruled out by a
    fact that is present (a required condition fails, or a `none` condition holds); None when some trigger still
    waits on facts nobody gave. The reason names the trigger and the facts that decided."""
    if not triggers:
        return None, "the incident states no trigger conditions"
    missing: list[str] = []
    ruled_out: list[str] = []
    for t in triggers:
        res = evaluate_trigger(t, facts)
        if res.fired:
            shown = ", ".join(f"{describe(c)} ({f.value!r})" if f is not None else describe(c) for c, f in res.matched)
            return True, f"{t.description or t.id}: {shown}"
        if res.blocked_by:
            c, f = res.blocked_by[0]
            ruled_out.append(f"{t.id}: {describe(c)}" + (f" ({f.value!r})" if f is not None else ""))
            continue
        unknown = [c.fact for c in t.all if c.fact not in facts and c.op != "absent"
                   and (c.value_fact is None or c.value_fact in facts)]
        unknown += [c.value_fact for c in t.all if c.value_fact and c.value_fact not in facts]
        failed = [c for c in t.all if c.fact in facts and (c.value_fact is None or c.value_fact in facts)
                  and not check(c, facts)[0]]
        any_known = [c for c in t.any if c.fact in facts]
        if failed:
            c = failed[0]
            ruled_out.append(f"{t.id}: not {describe(c)} ({facts.value(c.fact)!r})")
        elif t.any and len(any_known) == len(t.any) and not any(check(c, facts)[0] for c in t.any):
            ruled_out.append(f"{t.id}: none of " + ", ".join(describe(c) for c in t.any))
        else:
            missing += unknown or [c.fact for c in t.any if c.fact not in facts]
    if missing:
        return None, "unknown: " + ", ".join(dict.fromkeys(missing))
    return False, "; ".join(ruled_out)
