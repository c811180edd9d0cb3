"""The paste page at `/` and a self-hosted Swagger UI at `/docs`: no CDN, so both work with no internet."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent.parent / "static"

router = APIRouter(include_in_schema=False)


def prefers_chinese(accept_language: str) -> bool:
    """True when the highest-weighted language in an Accept-Language header is Chinese."""
    best, best_q = "", -1.0
    for i, part in enumerate(accept_language.split(",")):
        tag, _, params = part.strip().partition(";")
        q = 1.0
        for p in params.split(";"):
            k, _, v = p.strip().partition("=")
            if k == "q":
                try:
                    q = float(v)
                except ValueError:
                    q = 0.0
        q -= i * 1e-6  # equal weights: the earlier tag wins
        if tag and q > best_q:
            best, best_q = tag.lower(), q
    return best.startswith("zh")


@router.get("/", response_class=HTMLResponse)
def index(request: Request) -> HTMLResponse:
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    if prefers_chinese(request.headers.get("accept-language", "")):
        html = html.replace('<html lang="en">', '<html lang="zh-CN" data-lang="zh">', 1)
    else:
        html = html.replace('<html lang="en">', '<html lang="en" data-lang="en">', 1)
    return HTMLResponse(html, headers={"Vary": "Accept-Language", "Cache-Control": "no-cache"})


def _swagger_assets() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).resolve().parent / "static"


def install(app: FastAPI) -> None:
    """Mount the page's files and Swagger UI's (from the fastapi-offline package) and add /docs."""
    app.mount("/assets/swagger", StaticFiles(directory=_swagger_assets()), name="swagger-assets")
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.include_router(router)
    oauth_url = "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} — API",
                                   swagger_js_url="/assets/swagger/swagger-ui-bundle.js",
                                   swagger_css_url="/assets/swagger/swagger-ui.css",
                                   swagger_favicon_url="/static/favicon.svg", oauth2_redirect_url=oauth_url)

    @app.get(oauth_url, include_in_schema=False)
    def oauth_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()
