"""Turn the validator's check results into human lines and one JSON verdict (deepops' validator contract)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

STATUSES = ("pass", "fail", "skip")
NOT_CHECKED = {"section": "validator", "check": "ran", "status": "fail", "detail": "no check ran on this host"}


def _check(result):
    if not isinstance(result, dict) or result.get("status") not in STATUSES:
        raise AnsibleFilterError(f"a validator check must be a dict with status pass, fail or skip, got {result!r}")
    return result


def dinops_validate_line(result):
    """'PASS gpu_host/driver_loaded: NVIDIA driver 535.183.01 loaded'."""
    result = _check(result)
    name = f"{result.get('section', '?')}/{result.get('check', '?')}"
    return f"{result['status'].upper()} {name}: {result.get('detail', '')}"


def dinops_validate_report(results_by_host):
    """{host: [result, ...]} -> {passed, counts, hosts}. A host without results fails: it did not get checked."""
    if not isinstance(results_by_host, dict):
        raise AnsibleFilterError("dinops_validate_report expects a dict of host name to a list of results")
    counts = dict.fromkeys(STATUSES, 0)
    hosts = {}
    for host, results in sorted(results_by_host.items()):
        checked = [_check(r) for r in results or []]
        if not checked:
            checked = [
                {"section": "validator", "check": "ran", "status": "fail", "detail": "no check ran on this host"}
            ]
        for result in checked:
            counts[result["status"]] += 1
        hosts[host] = checked
    return {"passed": counts["fail"] == 0 and bool(hosts), "counts": counts, "hosts": hosts}


class FilterModule:
    """Validator report filters."""

    def filters(self):
        return {"dinops_validate_line": dinops_validate_line, "dinops_validate_report": dinops_validate_report}
