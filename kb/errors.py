"""Errors the library raises for bad input; the CLI maps them to exit codes and the API to HTTP statuses."""

from __future__ import annotations


class KBError(Exception):
    """Base class: a clear, user-facing message; never a traceback."""

    exit_code = 2
    http_status = 400
    code = "bad_request"


class InputError(KBError):
    """Malformed or unreadable input (binary junk, broken YAML/JSON, empty text)."""

    code = "invalid_input"
    http_status = 422


class InputTooLarge(KBError):
    """Input over a configured limit; the message names the limit."""

    code = "too_large"
    http_status = 413


class NotFound(KBError):
    """Unknown incident id, job id or file."""

    code = "not_found"
    http_status = 404
    exit_code = 3


class ValidationFailed(KBError):
    """A document does not satisfy the schema or uses an unknown category."""

    code = "validation_failed"
    http_status = 422
    exit_code = 1


class IndexError_(KBError):
    """The index could not be built or loaded."""

    code = "index_error"
    http_status = 503
