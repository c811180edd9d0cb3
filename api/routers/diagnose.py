"""POST /v1/diagnose: a pasted log / config / question as JSON, a raw text/plain paste, or file uploads."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from api.admission import ensure_connected
from api.bodies import parse_model
from api.deps import AdmissionDep, KBDep, MetricsDep, SettingsDep, require_read_key
from api.errors import ERROR_RESPONSES, APIError, ErrorResponse
from api.limits import check_config, check_log, check_question, decode_text
from kb.diagnose.models import Diagnosis

router = APIRouter(prefix="/v1", tags=["diagnose"], dependencies=[Depends(require_read_key)])


class DiagnoseRequest(BaseModel):
    """At least one of text, log, config, question. Each is plain text as pasted (a YAML/JSON config, a shell
    command line, a training log, a description); `text` is a paste of any of them, read as a text/plain body is."""

    model_config = ConfigDict(extra="forbid")
    text: str | None = Field(default=None, examples=["swift rlhf --rlhf_type dpo\n{'loss': nan, 'epoch': 0.1}"])
    log: str | None = Field(default=None, examples=["{'loss': nan, 'grad_norm': nan, 'epoch': 0.1}"])
    config: str | None = Field(default=None, examples=["rlhf_type: dpo\nsequence_parallel_size: 4"])
    question: str | None = Field(default=None, examples=["DPO nll_loss is nan"])
    k: int = Field(default=3, ge=1, le=10)
    # Answers to the differential questions (or any fact you know of the run): canonical key -> value. They outrank
    # what the paste says, and the ranking is redone with them (by the learned ranker, as for the paste alone).
    facts: dict[str, str | int | float | bool] | None = Field(
        default=None, max_length=32, examples=[{"sequence_parallel_size": 4, "precision": "bf16"}])


_FORM_FIELDS = ("log", "config", "question", "file")
_MULTIPART_SCHEMA = {
    "type": "object",
    "properties": {
        "log": {"type": "string", "format": "binary", "description": "training log (file or text)"},
        "config": {"type": "string", "format": "binary", "description": "config file (YAML/JSON/args)"},
        "question": {"type": "string"},
        "file": {"type": "string", "format": "binary", "description": "any paste; treated like text/plain"},
    },
}
OPENAPI_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": DiagnoseRequest.model_json_schema()},
            "text/plain": {"schema": {"type": "string"}, "example": "loss: nan\nsequence_parallel_size: 4"},
            "multipart/form-data": {"schema": _MULTIPART_SCHEMA},
        },
    }
}


async def _read_form(request: Request) -> dict[str, str]:
    form = await request.form(max_files=4, max_fields=8, max_part_size=1024 * 1024)
    out: dict[str, str] = {}
    try:
        for key, value in form.multi_items():
            if key not in _FORM_FIELDS:
                raise APIError(422, "invalid_input", f"unknown form field {key!r} (use {', '.join(_FORM_FIELDS)})")
            data = await value.read() if isinstance(value, UploadFile) else value.encode("utf-8")
            text = decode_text(data, key)
            out[key] = out[key] + "\n" + text if key in out else text
    finally:
        await form.close()
    return out


@router.post("/diagnose", openapi_extra=OPENAPI_BODY, response_model=Diagnosis,
             responses={**ERROR_RESPONSES, 503: {"model": ErrorResponse, "description": "busy: retry after "
                                                  "the Retry-After header's seconds"}})
async def diagnose(request: Request, settings: SettingsDep, kb: KBDep, metrics: MetricsDep,
                   admission: AdmissionDep,
                   k: int = Query(default=3, ge=1, le=10, description="for text/plain and multipart bodies")) -> Any:
    """Which known incidents explain this paste, with the evidence (log line, config key), fix and repro."""
    # The slot is taken before the body is read, so waiting clients hold no parsed bodies.
    async with admission.slot():
        fields, k = await _read_fields(request, settings, k)
        await ensure_connected(request)  # a client that left while queued gets no work done
        said = fields.pop("facts", None)  # the reporter's answers: the ranking is redone with them
        result = await run_in_threadpool(kb.diagnose, **{k_: v for k_, v in fields.items() if v}, k=k,
                                         answers=said or None)
    metrics.diagnoses.labels("abstained" if getattr(result, "abstained", False) else "matched").inc()
    return result


async def _read_fields(request: Request, settings, k: int) -> tuple[dict[str, str | None], int]:
    ctype = request.headers.get("content-type", "text/plain").split(";")[0].strip().lower()
    if ctype == "application/json" or ctype.endswith("+json"):
        body = parse_model(DiagnoseRequest, await request.body())
        fields = {"log": body.log, "config": body.config, "question": body.question, "text": body.text}
        if body.facts:
            if any(len(str(v)) > 200 or len(key) > 100 for key, v in body.facts.items()):
                raise APIError(422, "invalid_input", "facts: keys and values must be short")
            fields["facts"] = body.facts  # type: ignore[assignment]
        k = body.k
    elif ctype in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await _read_form(request)
        fields = {"log": form.get("log"), "config": form.get("config"), "question": form.get("question"),
                  "text": form.get("file")}
    elif ctype.startswith("text/") or ctype in ("", "application/octet-stream"):
        fields = {"log": None, "config": None, "question": None, "text": decode_text(await request.body(), "body")}
    else:
        raise APIError(415, "unsupported_media_type",
                       f"unsupported Content-Type {ctype!r}: send application/json, text/plain or multipart/form-data")
    if not any(v and (not isinstance(v, str) or v.strip()) for v in fields.values()):
        raise APIError(422, "invalid_input", "nothing to diagnose: send a log, a config, a question or a paste")
    check_log(fields["log"], settings)
    check_log(fields["text"], settings, what="paste")
    check_config(fields["config"], settings)
    check_question(fields["question"], settings)
    return fields, k
