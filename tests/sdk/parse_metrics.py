"""Parses a /metrics scrape with Prometheus's own Python parser (OpenMetrics text) and prints
its samples as JSON: [{"name", "labels", "value"}]. Usage: parse_metrics.py FILE"""
import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families

with open(sys.argv[1], encoding="utf-8") as scrape:
    families = text_string_to_metric_families(scrape.read())
    print(json.dumps([{"name": s.name, "labels": s.labels, "value": s.value}
                      for family in families for s in family.samples]))
