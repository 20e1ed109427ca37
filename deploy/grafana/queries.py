"""Every panel's PromQL, read from the committed dashboards (no Grafana SDK needed).

    from deploy.grafana.queries import panel_queries
    for q in panel_queries():
        q.dashboard, q.panel, q.ref_id, q.expr   # as Grafana holds it ($__rate_interval, ...)
        q.promql()                                # what Prometheus is sent: variables substituted

For the tests that parse each query (promtool) and run it against a real Prometheus: the
JSON is what Grafana loads, and a test keeps it equal to the Python that writes it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARDS_DIR = Path(__file__).resolve().parent / "dashboards"

# Grafana's own variables a panel's query may use, and what a test sends in their place:
# Grafana substitutes them per request (the rate window from the scrape interval, the
# range from the time picker). Any other ``$`` left in a query is a dashboard variable
# this substitution does not know, and :meth:`PanelQuery.promql` refuses it.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
}
_VARIABLE = re.compile(r"\$\{?\w+\}?")


@dataclass(frozen=True)
class PanelQuery:
    """One query of one panel: ``dashboard`` is its title, ``uid`` its file's stem."""

    uid: str
    dashboard: str
    panel: str
    ref_id: str
    expr: str
    instant: bool

    def promql(self, variables: dict[str, str] | None = None) -> str:
        """The query with Grafana's variables replaced (:data:`GRAFANA_VARIABLES`, or
        ``variables``), as Prometheus would receive it."""
        values = {**GRAFANA_VARIABLES, **(variables or {})}
        # Longest first: $__range must not eat the start of $__range_s.
        text = self.expr
        for name in sorted(values, key=len, reverse=True):
            text = text.replace(name, values[name])
        left = _VARIABLE.findall(text)
        if left:
            raise ValueError(f"{self.dashboard} / {self.panel}: no value for {', '.join(left)}")
        return text


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every panel, including those inside a collapsed row."""
    found: list[dict[str, Any]] = []
    for panel in panels:
        found.append(panel)
        found.extend(_panels(panel.get("panels") or []))
    return found


def panel_queries(folder: Path = DASHBOARDS_DIR) -> list[PanelQuery]:
    """Every Prometheus query of every panel of the dashboards in ``folder``, in order."""
    queries: list[PanelQuery] = []
    for path in sorted(folder.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in _panels(board.get("panels") or []):
            for target in panel.get("targets") or []:
                if "expr" not in target:
                    continue
                queries.append(
                    PanelQuery(
                        uid=path.stem,
                        dashboard=str(board["title"]),
                        panel=str(panel["title"]),
                        ref_id=str(target.get("refId", "")),
                        expr=str(target["expr"]),
                        instant=bool(target.get("instant", False)),
                    )
                )
    return queries
