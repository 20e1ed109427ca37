# syntax=docker/dockerfile:1
# gpufleet migrations: a one-shot image that brings the database to the newest schema
# (Alembic, idempotent) and exits. Installs only gpufleet.v1 and gpufleet.common[store].
# Build context is the repository root:
#   docker build -f deploy/migrate.Dockerfile -t gpufleet/migrate .
#   docker run --rm -e GPUFLEET_DATABASE_URL=postgresql://... gpufleet/migrate

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/gpufleet
COPY protos /src/protos
COPY libs/common /src/libs/common
RUN /opt/gpufleet/bin/pip install /src/protos "/src/libs/common[store]"

FROM python:3.11-slim
ENV PATH=/opt/gpufleet/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 gpufleet \
    && useradd --system --uid 10001 --gid gpufleet --create-home --home-dir /home/gpufleet \
       --shell /usr/sbin/nologin gpufleet
COPY --from=build /opt/gpufleet /opt/gpufleet
USER 10001:10001
WORKDIR /home/gpufleet
CMD ["python", "-m", "gpufleet.common.db.migrate"]
