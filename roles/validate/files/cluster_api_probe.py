# Runs inside the client pod (python3 with requests and Pillow): /healthz, /readyz, then one detection, through the
# inference Service. Prints one JSON line the validator reads.
import io
import json
import os

import requests
from PIL import Image

base = "http://dinops-serve:8000"
token = os.environ.get("DINO_API_TOKEN", "")
headers = {"Authorization": "Bearer " + token} if token else {}
out = {}
try:
    # /healthz answers 200 from the start with the model's state: waiting, loading, ready or failed.
    health = requests.get(base + "/healthz", timeout=10)
    health_body = health.json() if health.headers.get("content-type", "").startswith("application/json") else {}
    if isinstance(health_body, dict):
        out["model"] = health_body.get("model")
        out["checkpoint"] = health_body.get("checkpoint")
    ready = requests.get(base + "/readyz", timeout=10)
    out["readyz"] = ready.status_code
    image = io.BytesIO()
    Image.new("RGB", (64, 48), (120, 80, 40)).save(image, "JPEG")
    files = {"image": ("verify.jpg", image.getvalue(), "image/jpeg")}
    answer = requests.post(base + "/v1/detect", files=files, headers=headers, timeout=120)
    out["detect"] = answer.status_code
    body = answer.json()
    out["keys"] = sorted(body) if isinstance(body, dict) else []
    out["detections"] = len(body.get("detections", [])) if isinstance(body, dict) else -1
except (requests.RequestException, ValueError) as exc:
    out["error"] = str(exc)
print(json.dumps(out))
