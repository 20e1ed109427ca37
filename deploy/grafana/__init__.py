"""gpufleet's Grafana dashboards, as code.

The three dashboards (Fleet & money, Scheduler & tenants, Watchdogs & ledger) are written in
Python (:mod:`.fleet_money`, :mod:`.scheduler_tenants`, :mod:`.watchdogs_ledger`, with the
panel helpers in :mod:`.panels`) and committed as the JSON Grafana loads
(``deploy/grafana/dashboards/*.json``, written by ``scripts/gen-dashboards``; a test fails
when the two differ). Their PromQL names only metrics of the catalogue
(``gpufleet.common.metrics.catalog``), also held by a test.

Why Grafana's foundation SDK (``grafana-foundation-sdk``) and not grafanalib: it is Grafana
Labs' own, generated from the dashboard schema Grafana itself uses (this pin: Grafana 11.6,
``schemaVersion`` 41), so a builder exists for every panel option the running Grafana knows
and an option it does not know cannot be written; its builders are typed (``py.typed``), so
a misspelt option is a type error, not a panel that silently ignores it. grafanalib is a
community project that models an older schema by hand (graph panels, string-typed options)
and trails Grafana's releases. The SDK is a development tool only: the dashboards ship as
JSON, and nothing at run time imports it.

:mod:`.queries` reads the committed JSON (no SDK needed) and lists every panel's PromQL, for
the tests that parse the queries and run them against a real Prometheus.
"""
