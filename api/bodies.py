"""The one place request bodies are parsed (JSON, models, url-encoded forms) for routers and chat bots."""

from __future__ import annotations

import json
from typing import Any, TypeVar
from urllib.parse import parse_qs

from pydantic import BaseModel, ValidationError

from api.errors import APIError

M = TypeVar("M", bound=BaseModel)


def _has_lone_surrogate(value: Any) -> bool:
    """True when a parsed JSON value holds a string that is not valid Unicode (a lone \\ud800 escape).

    Iterative, so a deep structure cannot exhaust the stack here either."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def parse_json(raw: bytes, what: str = "body") -> Any:
    """JSON text -> value, or a 422 that says why: not JSON, nested too deeply, or not valid Unicode."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise APIError(422, "invalid_input", f"{what} is nested too deeply") from None
    except (ValueError, UnicodeDecodeError):  # JSONDecodeError is a ValueError
        raise APIError(422, "invalid_input", f"{what} is not valid JSON") from None
    if _has_lone_surrogate(value):
        raise APIError(422, "invalid_input", f"{what} holds a lone UTF-16 surrogate (\\ud800-\\udfff): not text")
    return value


def parse_object(raw: bytes, what: str = "body") -> dict[str, Any]:
    value = parse_json(raw, what)
    if not isinstance(value, dict):
        raise APIError(422, "invalid_input", f"{what} is not a JSON object")
    return value


def validation_message(err: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, x['loc'])) or 'body'}: {x['msg']}" for x in err.errors()[:5])


def parse_model(model: type[M], raw: bytes, what: str = "body") -> M:
    """JSON bytes -> a validated pydantic model, every failure a 422 with the first few reasons."""
    try:
        return model.model_validate(parse_json(raw, what))
    except ValidationError as e:
        raise APIError(422, "invalid_input", validation_message(e)) from None


def parse_form(raw: bytes) -> dict[str, str]:
    """application/x-www-form-urlencoded -> first value of each field (Slack's slash commands)."""
    text = raw.decode("utf-8", "replace")
    return {k: v[0] for k, v in parse_qs(text, max_num_fields=100).items()}
