"""POST /retrieval: Dify's external knowledge API, so a Dify app can use kb as its knowledge base."""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from api.deps import SettingsDep, get_kb, key_is_valid
from api.limits import check_question
from api.settings import Settings

router = APIRouter(tags=["dify"])

# The one knowledge source kb serves; Dify's "External Knowledge ID" field must name it.
KNOWLEDGE_ID = os.environ.get("KB_DIFY_KNOWLEDGE_ID", "kb-nan")


class RetrievalSetting(BaseModel):
    model_config = ConfigDict(extra="allow")
    top_k: int = Field(ge=1, le=50, examples=[5])
    score_threshold: float = Field(ge=0.0, le=1.0, examples=[0.5])


class RetrievalRequest(BaseModel):
    """Dify's request; `metadata_condition` is accepted and ignored (Dify has no UI for it)."""

    model_config = ConfigDict(extra="allow")
    knowledge_id: str = Field(min_length=1, max_length=200, examples=["kb-nan"])
    query: str = Field(min_length=1, examples=["DPO NLL loss nan"])
    retrieval_setting: RetrievalSetting


class Record(BaseModel):
    content: str
    score: float
    title: str
    metadata: dict[str, Any] = Field(default_factory=dict)  # Dify breaks on a null metadata


class RetrievalResponse(BaseModel):
    records: list[Record]


class DifyError(BaseModel):
    error_code: int
    error_msg: str


def _error(status: int, code: int, msg: str) -> JSONResponse:
    return JSONResponse({"error_code": code, "error_msg": msg}, status_code=status)


def dify_keys(settings: Settings) -> list[str]:
    """KB_DIFY_API_KEYS when set (a key only for Dify), else the server's KB_API_KEYS."""
    own = [k.strip() for k in os.environ.get("KB_DIFY_API_KEYS", "").split(",") if k.strip()]
    return own or settings.api_key_list


def _auth_error(request: Request, settings: Settings) -> JSONResponse | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip() or " " in token.strip():
        return _error(403, 1001, "Invalid Authorization header format. Expected 'Bearer <api-key>' format.")
    if not key_is_valid(token.strip(), dify_keys(settings)):
        return _error(403, 1002, "Authorization failed")
    return None


def _content(inc, lang: str, fix: str) -> str:
    pick = (lambda b: (getattr(b, lang) or b.en or b.zh)) if lang in ("en", "zh") else (lambda b: b.en or b.zh)
    labels = {"zh": ("现象", "根因", "修复"), "en": ("Symptoms", "Root cause", "Fix")}[lang if lang == "zh" else "en"]
    parts = [pick(inc.title), f"{labels[0]}: {pick(inc.summary)}", f"{labels[1]}: {pick(inc.root_cause.explanation)}",
             f"{labels[2]}: {fix or pick(inc.fix.summary)}"]
    return "\n".join(p for p in parts if p.strip())


_ERRORS = {403: {"model": DifyError, "description": "1001 bad Authorization header format, 1002 wrong key"},
           404: {"model": DifyError, "description": "2001 the knowledge does not exist"},
           422: {"description": "malformed body"}}


@router.post("/retrieval", response_model=RetrievalResponse, responses=_ERRORS,
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": RetrievalRequest.model_json_schema()}}}})
async def retrieval(request: Request, settings: SettingsDep, kb: Annotated[object, Depends(get_kb)]) -> Any:
    """Dify external knowledge API: `Authorization: Bearer KEY`, body {knowledge_id, query,
    retrieval_setting: {top_k, score_threshold}}; answers {records: [{content, score, title, metadata}]}."""
    denied = _auth_error(request, settings)
    if denied is not None:
        return denied
    try:
        body = RetrievalRequest.model_validate(json.loads(await request.body()))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return JSONResponse({"error": {"code": "invalid_input", "message": "body is not valid JSON"}}, 422)
    except ValidationError as e:
        msg = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'body'}: {x['msg']}" for x in e.errors()[:5])
        return JSONResponse({"error": {"code": "invalid_input", "message": msg}}, 422)
    if body.knowledge_id != KNOWLEDGE_ID:
        return _error(404, 2001, f"The knowledge does not exist: {body.knowledge_id!r} (this server has "
                                 f"{KNOWLEDGE_ID!r})")
    check_question(body.query, settings)
    setting = body.retrieval_setting
    res = await run_in_threadpool(kb.ask, body.query, min(setting.top_k, settings.max_k))
    records: list[Record] = []
    # An abstention means nothing in kb fits; candidates would only mislead the app's LLM.
    for r in [] if res.abstained else res.results:
        score = max(0.0, min(1.0, float(r.score)))
        if score < setting.score_threshold:
            continue
        inc = kb.get(r.id) if r.id else None  # no id: a cause with no curated incident, its similar reports
        urls = [u for u in (r.sources if inc is None else (s.url for s in inc.sources)) if u.startswith(("http://", "https://"))]
        content = _content(inc, res.lang, r.fix) if inc is not None else "\n".join([r.title, *r.evidence])
        records.append(Record(content=content, score=round(score, 4), title=r.title,
                              metadata={"id": r.id, "category": r.category, "framework": r.framework,
                                        "algorithm": r.algorithm, "url": urls[0] if urls else "",
                                        "sources": urls, "repro": r.repro, "lang": res.lang}))
    records = records[:setting.top_k]
    if records and res.questions:
        # kb is unsure: the app's LLM is told which questions would settle it, so it can ask the user (a query
        # that repeats the report with the answers in it is read like any paste).
        head = records[0]
        head.content += "\n" + _questions(res.questions, res.lang)
        head.metadata["questions"] = [q.question for q in res.questions]
    return RetrievalResponse(records=records)


def _questions(questions, lang: str) -> str:
    intro = ("kb 还不能确定原因；请用户回答下面的问题来区分候选原因：" if lang == "zh"
             else "kb is not sure yet; ask the user these questions to tell the candidates apart:")
    return "\n".join([intro, *(f"- {q.worded()}" for q in questions)])
