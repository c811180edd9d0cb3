# kb HTTP API (CPU). Serving (ask, diagnose, the web page, Dify, MCP) never imports torch, so the image has
# none: no CUDA wheels, no multi-GB layer. Repro jobs need torch: build with `--build-arg REPRO=1` to add the
# CPU build of torch explicitly from PyTorch's CPU index.
FROM python:3.11-slim AS build
WORKDIR /src
COPY . .
# The wheel carries incidents/, cases/ and the engine's data files (see setup.py).
RUN pip wheel --no-cache-dir --no-deps -w /wheels .

FROM python:3.11-slim
ARG REPRO=0
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 KB_DATA_DIR=/var/lib/kb
COPY --from=build /wheels /wheels
RUN if [ "$REPRO" = "1" ]; then \
        pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
        && pip install "$(ls /wheels/kb_nan-*.whl)[repro]"; \
    else \
        pip install /wheels/kb_nan-*.whl; \
    fi \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --home-dir /var/lib/kb kb && mkdir -p /var/lib/kb \
    && kb -q index \
    && chown -R kb /var/lib/kb

USER kb
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["kb", "serve", "--host", "0.0.0.0", "--port", "8000"]
