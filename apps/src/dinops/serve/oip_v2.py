"""The Open Inference Protocol (KServe V2, Triton's HTTP API) for the one model this server holds.

Routes and shapes: kserve/kserve@v0.20.0:docs/predict-api/v2/required_api.md and
python/kserve/kserve/protocol/rest/v2_endpoints.py (which also answers ``GET /v2/models``, and bodies
``{"live": true}`` / ``{"ready": true}`` on the health routes, where the spec asks only for the status). The model has
one version, ``1``; the ``/versions/1/`` forms of the model routes answer the same, other versions 404.

Tensor layout (one request holds N images; every image may find a different number of objects):

- input ``image``, BYTES, shape ``[N]``: one encoded image file (JPEG, PNG, ...) per element; in JSON ``data``
  each element is the file in standard base64 (JSON strings must be UTF-8 text, so raw bytes cannot go there;
  KServe's custom-model example reads BYTES over REST the same way: python/custom_model/model.py), as binary
  data (:mod:`dinops.serve.tensors`) the raw bytes;
- outputs, padded to K = the most detections any image of the request kept (K may be 0), best first per image:
  ``boxes`` FP32 ``[N, K, 4]`` (x1, y1, x2, y2 in pixels of the upright original image, as /v1/detect),
  ``scores`` FP32 ``[N, K]``, ``labels`` INT64 ``[N, K]`` (padding: boxes and scores 0, labels -1) and
  ``num_detections`` INT32 ``[N]``, the number of valid entries of each row. This is the layout of TensorRT's
  EfficientNMS plugin (NVIDIA/TensorRT plugin/efficientNMSPlugin/README.md: num_detections [B, 1] INT32,
  detection_boxes [B, max, 4], detection_scores, detection_classes [B, max]), with the count flat and no fixed max.

Request ``parameters``: ``threshold``, ``max_detections``, ``classes`` (as /v1/detect's query parameters, as JSON
numbers, strings or, for ``classes``, a list) and the extension's ``binary_data_output``; any other is a 400.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flask import Blueprint, Response, current_app, jsonify, request

import dinops
from dinops.serve import auth, detection, tensors
from dinops.serve.errors import ApiError
from dinops.serve.kserve_v1 import model_ready, models

VERSION = "1"
PLATFORM = "dinops_pytorch"  # "<project>_<format>" (required_api.md, Platforms); information only
INPUT = "image"
OUTPUTS = {  # name: (datatype, shape)
    "boxes": ("FP32", [-1, -1, 4]),
    "scores": ("FP32", [-1, -1]),
    "labels": ("INT64", [-1, -1]),
    "num_detections": ("INT32", [-1]),
}
PARAMETERS = ("threshold", "max_detections", "classes", "binary_data_output")


def blueprint(name: str) -> Blueprint:
    """Routes with the model's name in them (DINO_MODEL_NAME); any other name falls to the app's 404."""
    bp = Blueprint("oip_v2", __name__)
    bp.add_url_rule("/v2", view_func=server_metadata, methods=["GET"])
    bp.add_url_rule("/v2/health/live", view_func=live, methods=["GET"])
    bp.add_url_rule("/v2/health/ready", view_func=ready, methods=["GET"])
    bp.add_url_rule("/v2/models", view_func=models, methods=["GET"])
    for base in (f"/v2/models/{name}", f"/v2/models/{name}/versions/{VERSION}"):
        bp.add_url_rule(base, view_func=model_metadata, methods=["GET"])
        bp.add_url_rule(f"{base}/ready", view_func=model_ready, methods=["GET"])
        bp.add_url_rule(f"{base}/infer", view_func=infer, methods=["POST"])
    bp.before_request(auth.on("oip_v2.infer"))
    return bp


def server_metadata():
    return jsonify(name="dinops", version=dinops.__version__, extensions=["binary_tensor_data"])


def live():
    return jsonify(live=True)


def ready():
    detection.ready_runtime()
    return jsonify(ready=True)


def model_metadata():
    return jsonify(
        name=current_app.config["MODEL_NAME"],
        versions=[VERSION],
        platform=PLATFORM,
        inputs=[{"name": INPUT, "datatype": "BYTES", "shape": [-1]}],
        outputs=[{"name": n, "datatype": t, "shape": s} for n, (t, s) in OUTPUTS.items()],
    )


def _images(head: dict[str, Any], reader: tensors.BinaryReader) -> list[bytes]:
    inputs = head.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ApiError(400, "bad_input", f"'inputs' must be a list holding the input {INPUT!r} (BYTES, shape [N]).")
    names = [i.get("name") if isinstance(i, dict) else None for i in inputs]
    if names.count(INPUT) != 1 or len(names) != 1:
        raise ApiError(
            400, "bad_input", f"This model takes exactly one input, {INPUT!r} (BYTES, shape [N]); got {names}."
        )
    tensor = inputs[0]
    detection.check_keys(tensor, ("name", "shape", "datatype", "parameters", "data"), f"input {INPUT!r}", "bad_input")
    if tensor.get("datatype") != "BYTES":
        raise ApiError(
            400,
            "bad_input",
            f"input {INPUT!r} must be BYTES (one encoded image file per element), got {tensor.get('datatype')!r}.",
        )
    shape = tensor.get("shape")
    if not (isinstance(shape, list) and len(shape) == 1 and type(shape[0]) is int and shape[0] >= 1):
        raise ApiError(400, "bad_input", f"input {INPUT!r} must have shape [N] with N >= 1 images, got {shape!r}.")
    count = shape[0]
    detection.check_count(count)
    parameters = tensor.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ApiError(400, "bad_input", f"input {INPUT!r}: parameters must be an object.")
    detection.check_keys(parameters, ("binary_data_size",), f"parameters of input {INPUT!r}", "bad_input")
    if "binary_data_size" in parameters:
        if "data" in tensor:
            raise ApiError(400, "bad_input", f"input {INPUT!r} has both data and binary_data_size: send one.")
        blobs = tensors.bytes_elements(reader.take(parameters["binary_data_size"], INPUT), INPUT)
    elif "data" in tensor:
        values = tensors.flat(tensor["data"])
        blobs = [detection.base64_bytes(v, f"input {INPUT!r} element {i}") for i, v in enumerate(values)]
    else:
        raise ApiError(400, "bad_input", f"input {INPUT!r} has neither data nor parameters.binary_data_size.")
    if len(blobs) != count:
        raise ApiError(400, "bad_input", f"input {INPUT!r} holds {len(blobs)} elements but its shape says [{count}].")
    return blobs


def _requested(head: dict[str, Any], binary_default: bool) -> list[tuple[str, bool]]:
    """(output name, as binary data) in the order the request asks for them; all outputs when it names none."""
    outputs = head.get("outputs")
    if outputs is None:
        return [(name, binary_default) for name in OUTPUTS]
    if not isinstance(outputs, list):
        raise ApiError(400, "bad_output", "'outputs' must be a list of {\"name\": ...} objects.")
    wanted: list[tuple[str, bool]] = []
    for item in outputs:
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or name not in OUTPUTS:
            raise ApiError(400, "bad_output", f"Unknown output {name!r}: this model has {', '.join(OUTPUTS)}.")
        if name in {n for n, _ in wanted}:
            raise ApiError(400, "bad_output", f"Output {name!r} is requested twice.")
        detection.check_keys(item, ("name", "parameters"), f"output {name!r}", "bad_output")
        parameters = item.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise ApiError(400, "bad_output", f"output {name!r}: parameters must be an object.")
        detection.check_keys(parameters, ("binary_data",), f"parameters of output {name!r}", "bad_output")
        binary = parameters.get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise ApiError(400, "bad_output", f"output {name!r}: binary_data must be true or false, got {binary!r}.")
        wanted.append((name, binary))
    return wanted


def _tensors(found: list[detection.Detected], threshold: float, limit: int, wanted) -> dict[str, np.ndarray]:
    keeps = [detection.selected(f.prediction, threshold, limit, wanted) for f in found]
    k = max((len(keep) for keep in keeps), default=0)
    boxes = np.zeros((len(found), k, 4), np.float32)
    scores = np.zeros((len(found), k), np.float32)
    labels = np.full((len(found), k), -1, np.int64)
    for row, (f, keep) in enumerate(zip(found, keeps, strict=True)):
        for column, i in enumerate(keep):
            boxes[row, column] = f.prediction.boxes[i]
            scores[row, column] = f.prediction.scores[i]
            labels[row, column] = f.prediction.labels[i]
    counts = np.array([len(keep) for keep in keeps], np.int32)
    return {"boxes": boxes, "scores": scores, "labels": labels, "num_detections": counts}


def infer():
    detection.check_identity_encoding()
    body = request.get_data(cache=False)
    header = request.headers.get(tensors.HEADER)
    head_bytes, rest = tensors.split_body(body, header)
    if head_bytes is None:  # raw binary request: the body is the one image; every output comes back binary
        head: dict[str, Any] = {}
        blobs, binary_default = [rest], True
    else:
        head = detection.json_object(head_bytes, "The inference request (the body's JSON part)")
        detection.check_keys(head, ("id", "parameters", "inputs", "outputs", "model_name", "model_version"), "request")
        reader = tensors.BinaryReader(rest, header is not None)
        blobs = _images(head, reader)
        reader.finish()
    parameters = detection.json_parameters(head.get("parameters"), PARAMETERS)
    if head_bytes is not None:
        binary_default = parameters.get("binary_data_output", False)
        if not isinstance(binary_default, bool):
            raise ApiError(400, "bad_parameter", f"binary_data_output must be true or false, got {binary_default!r}.")
    request_id = head.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ApiError(400, "bad_request", f"'id' must be a string, got {request_id!r}.")
    requested = _requested(head, binary_default)
    threshold, limit, items = detection.json_options(parameters)
    runtime = detection.ready_runtime()
    wanted = detection.classes(items, runtime.detector)
    found = detection.detect(runtime, blobs, where=lambda i: f"input {INPUT!r} element {i}")
    arrays = _tensors(found, threshold, limit, wanted)
    answer: dict[str, Any] = {"model_name": current_app.config["MODEL_NAME"], "model_version": VERSION}
    if request_id is not None:
        answer["id"] = request_id
    answer["parameters"] = {"threshold": threshold, "max_detections": limit}
    outputs = [(tensors.Output(name, OUTPUTS[name][0], arrays[name]), binary) for name, binary in requested]
    content, headers = tensors.encode_response(answer, outputs)
    return Response(content, headers=headers)
