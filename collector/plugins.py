"""The one place where other parts of the collector plug into the query app and the CLI.

A plugin module (listed in ``PLUGIN_MODULES``) exposes ``PLUGIN: Plugin``. The collector
then, on the **query port** (never the public ingest port):

- includes each of ``routers`` (FastAPI ``APIRouter``; the API bearer token, when set,
  applies to them too); a route reads the shared objects from
  ``request.app.state.parallax`` (a ``Context``);
- enters ``lifespan(ctx)`` (an async context manager) once the store is migrated (which may
  be long after start when the store is unreachable) and leaves it at shutdown: the place
  for a background evaluator thread or task. An exception from it is logged, not fatal;
- calls ``check(settings)`` before serving: an exception there stops ``serve`` with one
  line (use it for configuration errors, which must not leave a half-working collector);
- calls ``add_cli(subparsers)`` when building ``parallax-collector``'s parser, so a plugin
  adds its own subcommand (e.g. ``sla``); the subcommand sets ``func`` with
  ``set_defaults(func=...)`` taking the parsed args and returning the exit status.

The SLA checker (collector/sla/) is the intended user: its routes (/v1/sla, /v1/alerts,
/ui), its evaluator and its ``sla`` subcommand live there, not here. A module that is
absent is skipped (the collector runs without it).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from collector.config import Settings
    from collector.store.client import Store

log = logging.getLogger("parallax.collector")

PLUGIN_MODULES: tuple[str, ...] = ("collector.sla.plugin",)


@dataclass(slots=True)
class Context:
    """What a plugin gets: the settings, the store (thread-safe; ``store.rows(sql, params)``,
    ``store.database``; the pairs table is ``{database}.pairs``, read with FINAL), and the
    metrics registry served at /metrics (register the plugin's own metrics on it)."""

    settings: Settings
    store: Store
    registry: CollectorRegistry
    migrated: threading.Event = field(default_factory=threading.Event)  # schema in place
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Plugin:
    name: str
    routers: Sequence[APIRouter] = ()
    lifespan: Callable[[Context], AbstractAsyncContextManager[None]] | None = None
    add_cli: Callable[[Any], None] | None = None  # argparse subparsers action
    # Called once before anything is served (e.g. validate a config file). An exception
    # stops ``serve`` with its message as the one line printed (exit status 2).
    check: Callable[[Settings], None] | None = None


def load(modules: Sequence[str] = PLUGIN_MODULES) -> list[Plugin]:
    out = []
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                continue  # the plugin is not installed: run without it
            raise
        plugin = getattr(mod, "PLUGIN", None)
        if isinstance(plugin, Plugin):
            out.append(plugin)
        else:
            log.warning("%s has no PLUGIN of type collector.plugins.Plugin; skipped", name)
    return out


def add_cli(subparsers: argparse._SubParsersAction[Any], plugins: Sequence[Plugin]) -> None:
    for p in plugins:
        if p.add_cli is not None:
            p.add_cli(subparsers)
