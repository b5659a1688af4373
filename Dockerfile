# One image for every Brimful process; the compose file picks the command.
# EXTRAS=embedded adds the Triton server bundled in nvidia-pytriton (the compose "triton" service).
FROM python:3.11-slim

ARG EXTRAS=""
WORKDIR /opt/brimful
ENV PYTHONUNBUFFERED=1

COPY pyproject.toml README.md LICENSE ./
COPY api ./api
COPY batcher ./batcher
COPY workers ./workers
COPY model_server ./model_server
COPY core ./core
COPY schemas ./schemas
COPY brimful ./brimful
COPY deploy ./deploy
RUN pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}"

# The processes run from elsewhere: started in /opt/brimful, `python -m brimful.api` would
# import the source folder brimful/ (the top floor alone) before the installed package.
WORKDIR /var/lib/brimful

USER nobody
