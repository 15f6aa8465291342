"""parallax-collector: receives server spans (OTLP) and browser beacons, stores them in
ClickHouse, pairs them by trace id, and checks the user-vs-server SLA."""
