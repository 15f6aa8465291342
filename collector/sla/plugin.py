"""The SLA checker as a collector plugin (collector/plugins.py): routes on the query port,
the evaluator inside ``serve``, and the ``sla`` subcommand.

``serve`` reads the SLA configuration file from ``PARALLAX_SLA_CONFIG``, else ``sla.yaml`` in
its data directory (YAML or TOML; validated at start: a mistake stops the collector with one
line naming the key).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from collector.plugins import Context, Plugin
from collector.sla import cli
from collector.sla.config import CONFIG_ENV, SlaConfig, load, locate
from collector.sla.service import SlaService, router

if TYPE_CHECKING:
    from collector.config import Settings

__all__ = ["CONFIG_ENV", "PLUGIN"]


def config_from_env(data_dir: Path | None = None) -> SlaConfig:
    path = locate(None, data_dir)
    return load(path) if path else SlaConfig()


@asynccontextmanager
async def lifespan(ctx: Context) -> AsyncIterator[None]:
    cfg = config_from_env(ctx.settings.data_dir)
    svc = SlaService(
        ctx.store.client,
        ctx.store.database,
        cfg,
        registry=ctx.registry,
        cluster=ctx.store.cluster,
    )
    svc.start()
    ctx.extra["sla"] = svc
    try:
        yield
    finally:
        svc.stop()


def check(settings: Settings) -> None:
    """Validate the config before serving: a mistake stops ``serve`` with one line."""
    config_from_env(settings.data_dir)


PLUGIN = Plugin(name="sla", routers=(router,), lifespan=lifespan, add_cli=cli.add_cli, check=check)
