# parallax-collector: stateless behind a load balancer when PARALLAX_STORE points at a
# ClickHouse server; with the embedded store (chDB) it owns /var/lib/parallax alone.
FROM python:3.11-slim
WORKDIR /opt/parallax
COPY requirements.lock pyproject.toml ./
COPY agent ./agent
COPY collector ./collector
COPY parallax_contracts ./parallax_contracts
COPY docs/contracts ./docs/contracts
# The compiled OTLP decoder and Native encoder are built in place and the compiler removed
# in the same layer (without them the collector works, at a lower ingest rate). The lock
# constrains the runtime dependencies (`-c`): the test tools it also pins stay out.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
 && pip install --no-cache-dir -c requirements.lock . \
 && cd / && python -m parallax_contracts.compiled \
 && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home /var/lib/parallax --create-home parallax
ENV PARALLAX_CONTRACTS_DIR=/opt/parallax/docs/contracts
USER parallax
EXPOSE 4318 4319
ENTRYPOINT ["parallax-collector"]
CMD ["serve", "--listen", "0.0.0.0:4318", "--admin-listen", "0.0.0.0:4319", "--data-dir", "/var/lib/parallax"]
