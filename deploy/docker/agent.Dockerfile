# parallax-agent: the node agent (run as a DaemonSet, deploy/k8s/agent-daemonset.yaml).
# Debian 12 to match the bcc the agent is tested with (python3-bpfcc 0.26). Kernel headers:
# the node's own, mounted at /lib/modules and /usr/src, are used when present; otherwise the
# image's Debian generic headers feed the fallback tree (tracepoint programs only), built
# at image build time so the agent starts without writing anything. The lock constrains the
# project's runtime dependencies (`-c`): the test tools it also pins stay out of the image.
# The compiled HTTP/1 head parser and OTLP attribute encoder are built in place and the
# compiler removed in the same layer (without them the agent parses heads and encodes spans
# in Python, at a higher CPU cost per request).
FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-bpfcc \
      linux-headers-amd64 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/parallax
COPY requirements.lock pyproject.toml ./
COPY agent ./agent
COPY collector ./collector
COPY parallax_contracts ./parallax_contracts
COPY docs/contracts ./docs/contracts
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev python3-dev \
 && python3 -m venv /opt/parallax/venv \
 && /opt/parallax/venv/bin/pip install --no-cache-dir -c requirements.lock . \
 && cd / && /opt/parallax/venv/bin/python -m parallax_contracts.compiled \
 && apt-get purge -y gcc libc6-dev python3-dev && apt-get autoremove -y \
 && rm -rf /var/lib/apt/lists/* \
 && cd /opt/parallax && ln -s /usr/lib/python3/dist-packages/bcc \
      "$(/opt/parallax/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/bcc" \
 && PARALLAX_CACHE_DIR=/var/cache/parallax /opt/parallax/venv/bin/python -m agent.kernel.headers build
ENV PATH=/opt/parallax/venv/bin:$PATH \
    PARALLAX_CACHE_DIR=/var/cache/parallax \
    PARALLAX_CONTRACTS_DIR=/opt/parallax/docs/contracts
ENTRYPOINT ["parallax-agent"]
CMD ["run", "--metrics-addr", "0.0.0.0:9464"]
