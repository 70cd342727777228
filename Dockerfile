# liftgate: one image for the gateway, the analytics service, migrations, the model
# simulator and the CLI (the compose file picks the command).
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Dependencies first, so code edits do not reinstall them. The services and the CLI's
# migrate/simulate commands only: the `local` extra (embedded PostgreSQL, psutil) stays out.
COPY pyproject.toml README.md ./
RUN mkdir -p contracts control eventbus serving gateway analytics evals curation liftgate migrations \
 && touch contracts/__init__.py control/__init__.py eventbus/__init__.py serving/__init__.py gateway/__init__.py analytics/__init__.py evals/__init__.py curation/__init__.py liftgate/__init__.py migrations/__init__.py \
 && pip install ".[cli]" && pip uninstall -y liftgate

COPY alembic.ini setup.py ./
COPY contracts ./contracts
COPY control ./control
COPY eventbus ./eventbus
COPY serving ./serving
COPY gateway ./gateway
COPY analytics ./analytics
COPY evals ./evals
COPY curation ./curation
COPY liftgate ./liftgate
COPY migrations ./migrations
COPY examples ./examples
# Editable: migrations are read from /app/migrations (see liftgate/db.py). gcc only for the
# install: it builds the consumer's C extension (setup.py; without it they are skipped
# and the same work runs in Python).
# The spool directory exists in the image, owned by the service user, so a named volume
# mounted there starts with that owner (the gateway writes its Kafka outage spool there).
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
 && pip install --no-deps -e . \
 && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/liftgate --create-home liftgate \
 && mkdir -p /var/lib/liftgate/spool && chown -R liftgate:liftgate /var/lib/liftgate

USER liftgate
EXPOSE 8080 8090
# Override per service: python -m gateway | python -m analytics | liftgate migrate | ...
CMD ["liftgate", "--help"]
