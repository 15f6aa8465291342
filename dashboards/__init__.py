"""The Grafana dashboards, built from code (grafana-foundation-sdk): ``python -m dashboards``
writes ``dashboards/*.json``; tests/test_dashboards.py fails while a committed file differs
from what the code builds. dashboards/README.md says why and what each one shows."""
