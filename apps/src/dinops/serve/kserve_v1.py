"""KServe's V1 protocol for the one model this server holds (DINO_MODEL_NAME).

Routes and shapes: kserve/kserve@v0.20.0:python/kserve/kserve/protocol/rest/v1_endpoints.py (``GET /v1/models``,
``GET /v1/models/<name>``, ``POST /v1/models/<name>:predict``; a model that is not ready answers 503 with
``{"error"}``, python/kserve/kserve/errors.py ``model_not_ready_handler``). ``:explain`` is not served.

Request: ``{"instances": [{"image": {"b64": "<base64 image file>"}}, ...], "parameters": {...}}``. An image is
given as TensorFlow Serving encodes binary values in JSON, an object ``{"b64": ...}``
(https://www.tensorflow.org/tfx/serving/api_rest#encoding_binary_values), either under the input's name
``image`` or, as the single input's value, directly as the instance. ``parameters`` (optional) holds
``threshold``, ``max_detections`` and ``classes``, as /v1/detect's query parameters (JSON numbers or strings; a
list for ``classes``), and applies to every instance. Answer: ``{"predictions": [...]}``, one per instance, in
order, each exactly what /v1/detect answers for that image.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify, request

from dinops.serve import auth, detection
from dinops.serve.errors import ApiError

PARAMETERS = ("threshold", "max_detections", "classes")


def blueprint(name: str) -> Blueprint:
    """Routes with the model's name in them; any other name falls to the app's 404."""
    bp = Blueprint("kserve_v1", __name__)
    bp.add_url_rule("/v1/models", view_func=models, methods=["GET"])
    bp.add_url_rule(f"/v1/models/{name}", view_func=model_ready, methods=["GET"])
    bp.add_url_rule(f"/v1/models/{name}:predict", view_func=predict, methods=["POST"])
    bp.before_request(auth.on("kserve_v1.predict"))
    return bp


def models():
    """The one model (KServe's V2 listing, ``GET /v2/models``, answers the same)."""
    return jsonify(models=[current_app.config["MODEL_NAME"]])


def model_ready():
    """``{"name", "ready": true}``, or the 503 that says why not (V1 and V2 alike)."""
    detection.ready_runtime()
    return jsonify(name=current_app.config["MODEL_NAME"], ready=True)


def _image(index: int, instance: Any) -> bytes:
    where = f"instances[{index}]"
    if isinstance(instance, dict) and set(instance) == {"image"}:
        where, instance = f"{where}.image", instance["image"]
    if not (isinstance(instance, dict) and set(instance) == {"b64"}):
        raise ApiError(
            400, "bad_instance", f'{where} must be {{"image": {{"b64": "<base64 image file>"}}}}, got {instance!r:.80}.'
        )
    return detection.base64_bytes(instance["b64"], f"{where}.b64")


def predict():
    detection.check_identity_encoding()
    body = detection.json_object(request.get_data(cache=False))
    detection.check_keys(body, ("instances", "parameters"), "request")
    instances = body.get("instances")
    if not isinstance(instances, list) or not instances:
        raise ApiError(400, "bad_instance", "'instances' must be a non-empty list of images.")
    detection.check_count(len(instances))
    parameters = detection.json_parameters(body.get("parameters"), PARAMETERS)
    blobs = [_image(i, instance) for i, instance in enumerate(instances)]
    threshold, limit, items = detection.json_options(parameters)
    runtime = detection.ready_runtime()
    wanted = detection.classes(items, runtime.detector)
    found = detection.detect(runtime, blobs, where=lambda i: f"instances[{i}]")
    return jsonify(predictions=[detection.detect_body(f, threshold, limit, wanted) for f in found])
