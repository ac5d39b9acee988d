"""``.dinops-download.json`` in the destination: what was downloaded, verified and extracted, so that a
re-run with the same inputs does no work (not even a network request)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

FILE = ".dinops-download.json"


class Manifest:
    def __init__(self, dest: Path) -> None:
        self.path = dest / FILE
        self._lock = threading.Lock()
        try:
            self.data: dict[str, Any] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.data.setdefault("version", 1)
        self.data.setdefault("files", {})
        self.data.setdefault("subsets", {})

    def entry(self, section: str, key: str) -> dict[str, Any] | None:
        return self.data[section].get(key)

    def record(self, section: str, key: str, value: dict[str, Any] | None) -> None:
        with self._lock:
            if value is None:
                self.data[section].pop(key, None)
            else:
                self.data[section][key] = {**value, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True))
            os.replace(tmp, self.path)
