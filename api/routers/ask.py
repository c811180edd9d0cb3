"""POST /v1/ask: ranked incidents with evidence and fix for a short question."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from api.admission import ensure_connected
from api.deps import AskAdmissionDep, KBDep, SettingsDep, require_read_key
from api.errors import ERROR_RESPONSES
from api.limits import check_question
from kb.kb import AskResult

router = APIRouter(prefix="/v1", tags=["ask"], dependencies=[Depends(require_read_key)])


class Filters(BaseModel):
    model_config = ConfigDict(extra="forbid")
    framework: str | None = Field(default=None, max_length=100, examples=["trl"])
    algorithm: str | None = Field(default=None, max_length=100, examples=["DPO"])
    category: str | None = Field(default=None, max_length=100)


class AskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, examples=["DPO NLL loss nan"])
    filters: Filters | None = None
    k: int = Field(default=5, ge=1, le=50)


@router.post("/ask", response_model=AskResult, responses=ERROR_RESPONSES)
async def ask(request: Request, body: AskRequest, settings: SettingsDep, kb: KBDep,
              admission: AskAdmissionDep) -> AskResult:
    """Answer a question in English or Chinese; `abstained` is true when nothing in the KB fits well."""
    check_question(body.question, settings)
    filters = body.filters.model_dump(exclude_none=True) if body.filters else None
    async with admission.slot():
        await ensure_connected(request)
        res = await run_in_threadpool(kb.ask, body.question, k=min(body.k, settings.max_k), filters=filters)
    for r in res.results:  # a seed article's file name means nothing to a client: links only
        r.sources = public_sources(r.sources)
    return res


def public_sources(sources: list[str]) -> list[str]:
    return [s for s in sources if s.startswith(("https://", "http://"))]
