"""HTTP layer of `kb`: a FastAPI app (REST + chat-ops) over the library; `api.app.create_app()` builds it."""
