# One image for every Brimful process; the compose file picks the command.
# EXTRAS=embedded adds the Triton server bundled in nvidia-pytriton (the compose "triton" service).
FROM python:3.11-slim

ARG EXTRAS=""
WORKDIR /opt/brimful
ENV PYTHONUNBUFFERED=1

COPY pyproject.toml README.md ./
COPY api ./api
COPY batcher ./batcher
COPY workers ./workers
COPY schemas ./schemas
COPY brimful ./brimful
COPY deploy ./deploy
RUN pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}"

USER nobody
