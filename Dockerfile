# kb HTTP API (CPU). Installs exactly as the README does, builds the index at image build time,
# and runs `kb serve` as a non-root user.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    KB_INCIDENTS_DIR=/app/incidents KB_DATA_DIR=/var/lib/kb

WORKDIR /app
COPY pyproject.toml README.md ./
COPY kb ./kb
COPY api ./api
RUN pip install torch==2.13.0 && pip install .

# Incidents last: editing one rebuilds only the index layer, not the dependencies.
COPY incidents ./incidents
RUN useradd --system --uid 10001 --home-dir /var/lib/kb kb && mkdir -p /var/lib/kb \
    && kb index \
    && chown -R kb /var/lib/kb

USER kb
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["kb", "serve", "--host", "0.0.0.0", "--port", "8000"]
