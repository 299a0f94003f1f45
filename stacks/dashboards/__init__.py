"""Dashboards where each team already looks, generated from the same rule and metric names
as the alarms: Grafana (Prometheus), the OpenShift console and the grafana-operator, an
Azure Monitor workbook, and the CloudWatch dashboard.

``panels.PANELS`` says what is drawn (spend burn, findings by rule and severity, one tile
per registered rule, jobs by verdict, throughput, GPU use and memory, what stopping
saved); each backend module says how, for its own metrics. A rule added to the registry
gets its tile everywhere without a list edit.
"""

from trainguard.stacks.dashboards.panels import PANELS, Panel, panels

__all__ = ["PANELS", "Panel", "panels"]
