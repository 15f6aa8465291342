"""SLA configuration: thresholds with per-metric and per-route overrides, receivers.

A YAML (``.yaml``/``.yml``) or TOML (``.toml``) file, validated once at start; any mistake
(an unknown key, a negative threshold, a bad duration) is one ``ConfigError`` whose message
names the key, e.g. ``routes[1].metrics.ttfb.band_ms: must be ≥ 0, got -3``. Example:

    band_ms: 15            # ± band around zero divergence
    min_samples: 100
    for: 2m                # how long out of band before firing
    hysteresis_ms: 3       # resolve only once |divergence| ≤ band − hysteresis (or ok)
    interval: 15s
    window: 5m
    metrics:
      duration: {band_ms: 50}
    routes:
      - route: /v1/chat    # exact route template; service optional (any)
        service: app
        band_ms: 25
        metrics:
          itl: {band_ms: 40, for: 5m}
    alertmanager:
      url: http://alertmanager:9093
      resend: 1m
    webhook:
      url: https://hooks.example/sla
      headers: {Authorization: Bearer x}
    grafana:
      url: https://grafana.example   # alerts link to its route dashboard; absent: no link
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from collector.sla.source import METRIC_ORDER


class ConfigError(ValueError):
    """One clear line naming the offending key."""


_DUR = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any, key: str = "duration") -> float:
    """'15s', '2m', '500ms', '1h' or a number of seconds → seconds (> 0)."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a duration like 15s, 2m, 500ms; got {value!r}")
    if isinstance(value, int | float):
        secs = float(value)
    else:
        m = _DUR.match(str(value).strip())
        if not m:
            raise ConfigError(f"{key}: expected a duration like 15s, 2m, 500ms; got {value!r}")
        secs = float(m.group(1)) * _UNIT[m.group(2)]
    if secs <= 0:
        raise ConfigError(f"{key}: must be > 0, got {value!r}")
    return secs


@dataclass(frozen=True, slots=True)
class Thresholds:
    band_ms: float = 15.0
    min_samples: int = 100
    for_s: float = 120.0
    hysteresis_ms: float = 3.0


@dataclass(frozen=True, slots=True)
class Receiver:
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 5.0
    resend_s: float = 60.0


@dataclass(frozen=True, slots=True)
class RouteRule:
    route: str
    service: str | None
    base: dict[str, Any]
    metrics: dict[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class SlaConfig:
    defaults: Thresholds = field(default_factory=Thresholds)
    metric_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    routes: tuple[RouteRule, ...] = ()
    interval_s: float = 15.0
    window_s: float = 300.0
    alertmanager: Receiver | None = None
    webhook: Receiver | None = None
    grafana_url: str = ""  # base URL of the Grafana holding dashboards/*.json; '' = no link

    def thresholds(self, service: str, route: str, metric: str) -> Thresholds:
        """Defaults < metric override < route override < route+metric override."""
        merged: dict[str, Any] = {
            "band_ms": self.defaults.band_ms,
            "min_samples": self.defaults.min_samples,
            "for_s": self.defaults.for_s,
            "hysteresis_ms": self.defaults.hysteresis_ms,
        }
        merged.update(self.metric_overrides.get(metric, {}))
        for r in self.routes:
            if r.route == route and (r.service is None or r.service == service):
                merged.update(r.base)
                merged.update(r.metrics.get(metric, {}))
        return Thresholds(**merged)


_THRESHOLD_KEYS = {"band_ms", "min_samples", "for", "hysteresis_ms"}
_TOP_KEYS = _THRESHOLD_KEYS | {
    "interval",
    "window",
    "metrics",
    "routes",
    "alertmanager",
    "webhook",
    "grafana",
}
_RECEIVER_KEYS = {"url", "headers", "timeout", "resend"}
_URL = re.compile(r"^https?://[^\s/]+")


def _mapping(v: Any, key: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ConfigError(f"{key}: expected a mapping, got {type(v).__name__}")
    return v


def _unknown(d: dict[str, Any], allowed: set[str], prefix: str) -> None:
    for k in d:
        if k not in allowed:
            where = f"{prefix}.{k}" if prefix else str(k)
            raise ConfigError(f"{where}: unknown key (allowed: {', '.join(sorted(allowed))})")


def _number(v: Any, key: str, integer: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"{key}: expected a number, got {v!r}")
    if integer and not isinstance(v, int):
        raise ConfigError(f"{key}: expected a whole number, got {v!r}")
    if v < 0:
        raise ConfigError(f"{key}: must be ≥ 0, got {v!r}")
    return float(v)


def _thresholds(d: dict[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    p = f"{prefix}." if prefix else ""
    if "band_ms" in d:
        out["band_ms"] = _number(d["band_ms"], f"{p}band_ms")
    if "hysteresis_ms" in d:
        out["hysteresis_ms"] = _number(d["hysteresis_ms"], f"{p}hysteresis_ms")
    if "min_samples" in d:
        n = int(_number(d["min_samples"], f"{p}min_samples", integer=True))
        if n < 1:
            raise ConfigError(f"{p}min_samples: must be ≥ 1, got {n}")
        out["min_samples"] = n
    if "for" in d:
        out["for_s"] = 0.0 if d["for"] in (0, "0", "0s") else parse_duration(d["for"], f"{p}for")
    return out


def _receiver(v: Any, key: str) -> Receiver:
    d = _mapping(v, key)
    _unknown(d, _RECEIVER_KEYS, key)
    url = d.get("url")
    if not isinstance(url, str) or not _URL.match(url):
        raise ConfigError(f"{key}.url: expected an http(s) URL, got {url!r}")
    headers = _mapping(d.get("headers", {}), f"{key}.headers")
    for hk, hv in headers.items():
        if not isinstance(hv, str):
            raise ConfigError(f"{key}.headers.{hk}: expected a string")
    return Receiver(
        url=url.rstrip("/"),
        headers={str(k): str(v) for k, v in headers.items()},
        timeout_s=parse_duration(d["timeout"], f"{key}.timeout") if "timeout" in d else 5.0,
        resend_s=parse_duration(d["resend"], f"{key}.resend") if "resend" in d else 60.0,
    )


def _grafana(v: Any) -> str:
    """``grafana: {url: …}``: the base URL alerts link to (a sub-path like /grafana kept)."""
    d = _mapping(v, "grafana")
    _unknown(d, {"url"}, "grafana")
    url = d.get("url")
    if not isinstance(url, str) or not _URL.match(url) or any(c in url for c in "?#"):
        raise ConfigError(f"grafana.url: expected an http(s) base URL, got {url!r}")
    return url.rstrip("/")


def from_mapping(raw: Any) -> SlaConfig:
    d = _mapping(raw if raw is not None else {}, "(top level)")
    _unknown(d, _TOP_KEYS, "")
    base = Thresholds(**_thresholds(d, ""))
    metric_overrides: dict[str, dict[str, Any]] = {}
    for m, v in _mapping(d.get("metrics", {}), "metrics").items():
        if m not in METRIC_ORDER:
            raise ConfigError(f"metrics.{m}: unknown metric (known: {', '.join(METRIC_ORDER)})")
        md = _mapping(v, f"metrics.{m}")
        _unknown(md, _THRESHOLD_KEYS, f"metrics.{m}")
        metric_overrides[m] = _thresholds(md, f"metrics.{m}")
    routes: list[RouteRule] = []
    raw_routes = d.get("routes", [])
    if not isinstance(raw_routes, list):
        raise ConfigError("routes: expected a list")
    for i, r in enumerate(raw_routes):
        key = f"routes[{i}]"
        rd = _mapping(r, key)
        _unknown(rd, _THRESHOLD_KEYS | {"route", "service", "metrics"}, key)
        route = rd.get("route")
        if not isinstance(route, str) or not route:
            raise ConfigError(f"{key}.route: required, a route template like /v1/chat")
        service = rd.get("service")
        if service is not None and not isinstance(service, str):
            raise ConfigError(f"{key}.service: expected a string")
        per_metric: dict[str, dict[str, Any]] = {}
        for m, v in _mapping(rd.get("metrics", {}), f"{key}.metrics").items():
            if m not in METRIC_ORDER:
                raise ConfigError(
                    f"{key}.metrics.{m}: unknown metric (known: {', '.join(METRIC_ORDER)})"
                )
            md = _mapping(v, f"{key}.metrics.{m}")
            _unknown(md, _THRESHOLD_KEYS, f"{key}.metrics.{m}")
            per_metric[m] = _thresholds(md, f"{key}.metrics.{m}")
        routes.append(RouteRule(route, service, _thresholds(rd, key), per_metric))
    return SlaConfig(
        defaults=base,
        metric_overrides=metric_overrides,
        routes=tuple(routes),
        interval_s=parse_duration(d["interval"], "interval") if "interval" in d else 15.0,
        window_s=parse_duration(d["window"], "window") if "window" in d else 300.0,
        alertmanager=_receiver(d["alertmanager"], "alertmanager") if "alertmanager" in d else None,
        webhook=_receiver(d["webhook"], "webhook") if "webhook" in d else None,
        grafana_url=_grafana(d["grafana"]) if "grafana" in d else "",
    )


CONFIG_ENV = "PARALLAX_SLA_CONFIG"
DATA_DIR_CONFIG = "sla.yaml"


def locate(explicit: str | Path | None, data_dir: str | Path | None) -> Path | None:
    """The config file to use: the one given, else $PARALLAX_SLA_CONFIG, else ``sla.yaml``
    in the data directory (so ``sla --once --data-dir D`` judges with the thresholds the
    collector serving D used), else none (the defaults)."""
    if explicit:
        return Path(explicit)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    if data_dir is not None and (Path(data_dir) / DATA_DIR_CONFIG).is_file():
        return Path(data_dir) / DATA_DIR_CONFIG
    return None


def load(path: str | Path) -> SlaConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read ({e.strerror})") from None
    try:
        if p.suffix == ".toml":
            raw: Any = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            raw = yaml.safe_load(text)
        else:
            raise ConfigError(f"{p}: expected a .yaml, .yml or .toml file")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{p}: not valid {p.suffix[1:].upper()}: {e}") from None
    try:
        return from_mapping(raw)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
