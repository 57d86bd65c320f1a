# LLMServeEnv as a Hugging Face Docker Space (README front matter: sdk docker, app_port 7860).
# CPU only, simulator mode: no GPU, no API key, no torch (the `train` extra stays out).
# trace:PATH replays read files under /app/traces only (mount traces there), so a public Space
# cannot be used to probe the container's files.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    LLMSERVE_MODE=sim \
    ENABLE_WEB_INTERFACE=true \
    LLMSERVE_TRACE_DIR=/app/traces

# Spaces run the container as uid 1000; the same user owns nothing it could overwrite.
RUN useradd --create-home --uid 1000 --shell /usr/sbin/nologin app

WORKDIR /app
# The whole package, weights/ included (.dockerignore keeps tests, caches and venvs out).
COPY . .
# Dependencies come from pyproject.toml alone: the package's own [project] dependencies, no extras.
# traces/ (under WORKDIR) is the folder LLMSERVE_TRACE_DIR names: the server refuses to start
# without it.
RUN mkdir -p traces && pip install --no-cache-dir .

USER 1000:1000
# Every compiled kernel (numba: the simulator's engine and router, the grader's floor, the metrics'
# percentiles; core/kernels.py) compiled once, at build time, as the user that serves: numba keeps a cache
# only where it may write, so it is the user's own (its home), and the server loads them at start-up
# instead of compiling them (~45 s from nothing on a 2-core machine) on every container start.
ENV NUMBA_CACHE_DIR=/home/app/.cache/numba
RUN python -c "from llmserve_env.core.kernels import warm; warm()"
EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:7860/health', timeout=4).status != 200)"]
# uvicorn with the slow-client, connection and log bounds of server/serving.py (as `make serve`).
CMD ["python", "-m", "llmserve_env.server.serving", "--host", "0.0.0.0", "--port", "7860"]
