"""SLA config files: overrides apply; mistakes are one clear error naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.sla.config import ConfigError, load


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_yaml_overrides(tmp_path: Path) -> None:
    cfg = load(
        _write(
            tmp_path,
            "sla.yaml",
            """
band_ms: 20
for: 90s
metrics:
  duration: {band_ms: 50}
routes:
  - route: /v1/chat
    service: app
    band_ms: 25
    metrics:
      itl: {band_ms: 40, for: 5m}
alertmanager: {url: "http://am:9093", resend: 30s}
""",
        )
    )
    assert cfg.thresholds("x", "/other", "ttfb").band_ms == 20
    assert cfg.thresholds("x", "/other", "ttfb").for_s == 90
    assert cfg.thresholds("x", "/other", "duration").band_ms == 50
    assert cfg.thresholds("app", "/v1/chat", "duration").band_ms == 25
    assert cfg.thresholds("other", "/v1/chat", "ttfb").band_ms == 20  # service must match
    t = cfg.thresholds("app", "/v1/chat", "itl")
    assert (t.band_ms, t.for_s) == (40, 300)
    assert cfg.alertmanager is not None and cfg.alertmanager.resend_s == 30


def test_toml(tmp_path: Path) -> None:
    cfg = load(
        _write(tmp_path, "sla.toml", 'band_ms = 12\n[[routes]]\nroute = "/a"\nmin_samples = 50\n')
    )
    assert cfg.thresholds("s", "/a", "ttfb").min_samples == 50
    assert cfg.thresholds("s", "/b", "ttfb").band_ms == 12


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("band_ms: 15\nbandms: 3\n", "bandms: unknown key"),
        (
            "routes:\n  - route: /a\n    metrics:\n      ttfb: {band_ms: -3}\n",
            "routes[0].metrics.ttfb.band_ms: must be ≥ 0",
        ),
        ("for: 2 minutes\n", "for: expected a duration"),
        ("interval: -5s\n", "interval: expected a duration"),
        ("metrics:\n  latency: {band_ms: 3}\n", "metrics.latency: unknown metric"),
        ("routes:\n  - service: x\n", "routes[0].route: required"),
        ("alertmanager: {url: 'ftp://x'}\n", "alertmanager.url: expected an http(s) URL"),
        ("webhook: {url: 'http://x', retries: 3}\n", "webhook.retries: unknown key"),
        ("min_samples: 0\n", "min_samples: must be ≥ 1"),
        ("grafana: {url: 'grafana.example'}\n", "grafana.url: expected an http(s) base URL"),
        ("grafana: {url: 'https://g/d/x?orgId=1'}\n", "grafana.url: expected an http(s) base"),
        ("grafana: {uri: 'https://g'}\n", "grafana.uri: unknown key"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    p = _write(tmp_path, "sla.yaml", text)
    with pytest.raises(ConfigError) as e:
        load(p)
    assert key in str(e.value)
    assert "\n" not in str(e.value)


def test_locate_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from collector.sla.config import CONFIG_ENV, locate

    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert locate(None, data) is None  # nothing anywhere: the defaults
    (data / "sla.yaml").write_text("band_ms: 20\n")
    assert locate(None, data) == data / "sla.yaml"  # the data directory's own
    env_file = tmp_path / "env.yaml"
    monkeypatch.setenv(CONFIG_ENV, str(env_file))
    assert locate(None, data) == env_file  # the environment beats the data directory
    assert locate("given.toml", data) == Path("given.toml")  # an explicit file beats all
    monkeypatch.delenv(CONFIG_ENV)
    assert load(locate(None, data)).defaults.band_ms == 20  # type: ignore[arg-type]


def test_grafana_base_url_is_optional(tmp_path: Path) -> None:
    """Absent: alerts carry no dashboard link. A sub-path (Grafana behind /grafana) is kept,
    its trailing slash dropped (the link appends /d/<uid>)."""
    assert load(_write(tmp_path, "a.yaml", "band_ms: 15\n")).grafana_url == ""
    cfg = load(_write(tmp_path, "b.yaml", "grafana: {url: 'https://ops.example/grafana/'}\n"))
    assert cfg.grafana_url == "https://ops.example/grafana"
