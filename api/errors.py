"""One error shape for every failure, {"error": {"code", "message"}}, and the handlers that produce it."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from kb.errors import KBError

log = logging.getLogger("kb.api")

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "request_timeout",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    429: "too_many_requests",
    499: "client_closed_request",
    503: "unavailable",
}


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    """What every 4xx/5xx answer looks like."""

    error: ErrorBody


class APIError(StarletteHTTPException):
    """An HTTP failure with a stable machine-readable code (raised by the HTTP layer itself)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status_code=status, detail=message, headers=headers)
        self.code = code


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


# Documented on every route so clients (and schemathesis) know the error shape.
ERROR_RESPONSES: dict[int | str, dict] = {
    s: {"model": ErrorResponse, "description": d}
    for s, d in ((401, "missing or bad API key"), (404, "unknown id"), (413, "over a size limit"),
                 (422, "malformed input"))
}


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "malformed request"


def kb_error_response(exc: KBError) -> JSONResponse:
    """The one mapping of library errors to HTTP: each KBError subclass names its 4xx status and code."""
    status = int(getattr(exc, "http_status", 400))
    return error_response(status if 400 <= status < 600 else 400, str(getattr(exc, "code", "bad_request")),
                          str(exc) or type(exc).__name__)


def install(app: FastAPI) -> None:
    @app.exception_handler(KBError)
    async def _kb_error(_: Request, exc: KBError) -> JSONResponse:
        return kb_error_response(exc)

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, _: ClientDisconnect) -> JSONResponse:
        # The client hung up mid-body: nobody reads this answer, and it is not a server error.
        log.info("client disconnected while sending %s %s", request.method, request.url.path)
        return error_response(499, "client_closed_request", "the client disconnected before the body arrived")

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_input", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = getattr(exc, "code", None) or _STATUS_CODES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return error_response(exc.status_code, code, message, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The traceback goes to the server log, never to the client.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", "internal error; the server log has the details")
