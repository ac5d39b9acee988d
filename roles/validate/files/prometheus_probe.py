"""Probe run inside the Prometheus container (`docker exec dinops-prometheus python3 -c <this>`, or kubectl exec
deploy/dinops-prometheus -c prometheus): its readiness, its active scrape targets and its alerts, as one JSON line.

Only what the validator decides on is printed (filter_plugins/validate_monitoring.py): per target labels.job,
scrapeUrl, health and lastError; per alert labels.alertname, labels.severity and state; kept in the API's own shape
so that the filter reads the probe's line and a full answer alike. Nothing else leaves the container. Standard
library only: the image has python3 and no more.

Endpoints, Prometheus v2.42.0 (docs/querying/api.md "Targets" and "Alerts"; web/web.go for /-/ready, 200 "Prometheus
Server is Ready." or 503 "Service Unavailable"): GET /-/ready, GET /api/v1/targets?state=active, GET /api/v1/alerts.
The first argument, when given, replaces the base URL (the tests run the probe against a Prometheus on a free port).
"""

import json
import sys
import urllib.error
import urllib.request

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:9090"


def get(path):
    """(HTTP status or None, body text or the error's words)."""
    try:
        with urllib.request.urlopen(BASE + path, timeout=10) as answer:
            return answer.status, answer.read(1 << 22).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(2000).decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        return None, str(exc)


def api(path, reduce):
    status, body = get(path)
    if status != 200:
        return {"status": "error", "error": f"HTTP {status}: {body[:300]}" if status else body[:300]}
    try:
        answer = json.loads(body)
        return {"status": answer["status"], "data": reduce(answer["data"])}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return {"status": "error", "error": f"not a Prometheus API answer ({exc.__class__.__name__}): {body[:300]}"}


def targets(data):
    keep = ("scrapeUrl", "health", "lastError")
    return {"activeTargets": [{"labels": {"job": t.get("labels", {}).get("job")}} | {k: t.get(k) for k in keep}
                              for t in data["activeTargets"]]}  # fmt: skip


def alerts(data):
    return {"alerts": [{"labels": {k: a.get("labels", {}).get(k) for k in ("alertname", "severity")},
                        "state": a.get("state")} for a in data["alerts"]]}  # fmt: skip


status, body = get("/-/ready")
print(json.dumps({
    "ready": {"status": status, "body": body.strip()[:300]},
    "targets": api("/api/v1/targets?state=active", targets),
    "alerts": api("/api/v1/alerts", alerts),
}))  # fmt: skip
