"""The SLA checker as a collector plugin (collector/plugins.py): routes on the query port,
the evaluator inside ``serve``, and the ``sla`` subcommand.

``serve`` reads the SLA configuration file from ``PARALLAX_SLA_CONFIG`` (YAML or TOML;
validated at start: a mistake stops the collector with one line naming the key).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from collector.plugins import Context, Plugin
from collector.sla import cli
from collector.sla.config import SlaConfig, load
from collector.sla.service import SlaService, router

CONFIG_ENV = "PARALLAX_SLA_CONFIG"


def config_from_env() -> SlaConfig:
    path = os.environ.get(CONFIG_ENV)
    return load(path) if path else SlaConfig()


@asynccontextmanager
async def lifespan(ctx: Context) -> AsyncIterator[None]:
    svc = SlaService(ctx.store.client, ctx.store.database, config_from_env(), registry=ctx.registry)
    svc.start()
    ctx.extra["sla"] = svc
    try:
        yield
    finally:
        svc.stop()


PLUGIN = Plugin(name="sla", routers=(router,), lifespan=lifespan, add_cli=cli.add_cli)
