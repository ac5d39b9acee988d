"""The OpenAPI 3.0 description served at ``/openapi.json``; a test checks it lists every route of the app."""

from __future__ import annotations

from typing import Any

from dinops.serve.oip_v2 import VERSION

_ERROR = {"$ref": "#/components/schemas/Error"}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "bad image, parameter or request body",
        404: "no such model (DINO_MODEL_NAME) or version",
        401: "missing or wrong bearer token",
        413: "upload or image too large, or too many images (the message names the limit's setting)",
        415: "not an accepted content type or image format",
        429: "no room for the images in flight or no free decode slot; see Retry-After",
        503: "busy, waiting for a model, loading or overloaded; see Retry-After",
    }
    return {str(c): {"description": text[c], "content": {"application/json": {"schema": _ERROR}}} for c in codes}


def _image_body() -> dict[str, Any]:
    binary = {"type": "string", "format": "binary"}
    return {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {"type": "object", "required": ["image"], "properties": {"image": binary}}
            },
            "image/*": {"schema": binary},
        },
    }


def _json_body(description: str) -> dict[str, Any]:
    return {
        "required": True,
        "description": description,
        "content": {"application/json": {"schema": {"type": "object"}}},
    }


def _get(summary: str, *errors: int) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {"200": {"description": "see docs/api.md"}, **_errors(*errors)}}}


def _protocol_paths(config: dict[str, Any], security: list[dict[str, list]]) -> dict[str, Any]:
    """KServe V1 and Open Inference Protocol V2 (docs/api.md describes the bodies and the tensor layout)."""
    name = config["MODEL_NAME"]
    predict_responses = {"200": {"description": '{"predictions": [one /v1/detect answer per instance]}'}}
    infer = {
        "post": {
            "summary": "detections of N images (input 'image' BYTES [N]; outputs boxes, scores, labels, "
            "num_detections); JSON, or the binary tensor data extension with Inference-Header-Content-Length",
            "security": security,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                },
            },
            "responses": {"200": {"description": "inference response"}, **_errors(400, 401, 404, 413, 415, 429, 503)},
        }
    }
    paths: dict[str, Any] = {
        "/v1/models": _get('KServe V1: the models served, {"models": [name]}'),
        f"/v1/models/{name}": _get('KServe V1: {"name", "ready": true} once the model is ready', 503),
        f"/v1/models/{name}:predict": {
            "post": {
                "summary": 'KServe V1 predict: {"instances": [{"image": {"b64": ...}}], "parameters": {...}}',
                "security": security,
                "requestBody": _json_body("instances and parameters (threshold, max_detections, classes)"),
                "responses": {**predict_responses, **_errors(400, 401, 404, 413, 415, 429, 503)},
            }
        },
        "/v2": _get("Open Inference Protocol: server metadata (name, version, extensions)"),
        "/v2/health/live": _get("Open Inference Protocol: the server is live"),
        "/v2/health/ready": _get("Open Inference Protocol: the model is ready", 503),
        "/v2/models": _get("Open Inference Protocol (KServe): the models served"),
    }
    for base in (f"/v2/models/{name}", f"/v2/models/{name}/versions/{VERSION}"):
        paths[base] = _get("Open Inference Protocol: model metadata (inputs, outputs, platform, versions)")
        paths[f"{base}/ready"] = _get("Open Inference Protocol: the model is ready", 503)
        paths[f"{base}/infer"] = infer
    return paths


def spec(config: dict[str, Any]) -> dict[str, Any]:
    threshold = {
        "name": "threshold",
        "in": "query",
        "schema": {"type": "number", "minimum": 0, "maximum": 1, "default": config["THRESHOLD"]},
        "description": "drop detections scoring below this",
    }
    max_det = {
        "name": "max_detections",
        "in": "query",
        "schema": {
            "type": "integer",
            "minimum": 1,
            "maximum": config["MAX_DETECTIONS"],
            "default": config["MAX_DETECTIONS"],
        },
    }
    classes = {
        "name": "classes",
        "in": "query",
        "schema": {"type": "string"},
        "description": "comma-separated class ids or names to keep (e.g. 'person,dog' or '1,18')",
    }
    detection = {
        "type": "object",
        "properties": {
            "box": {
                "type": "array",
                "items": {"type": "number"},
                "minItems": 4,
                "maxItems": 4,
                "description": "x1,y1,x2,y2 pixels",
            },
            "label": {"type": "integer", "description": "category id (COCO ids for COCO models)"},
            "name": {"type": "string"},
            "score": {"type": "number"},
        },
    }
    security = [{"bearer": []}] if config["API_TOKEN"] else []
    return {
        "openapi": "3.0.3",
        "info": {"title": "dinops DINO inference API", "version": "1"},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "properties": {"error": {"type": "string"}, "code": {"type": "string"}}},
                "Detection": detection,
            },
        },
        "paths": {
            "/v1/detect": {
                "post": {
                    "summary": "detect objects in one image",
                    "security": security,
                    "parameters": [threshold, max_det, classes],
                    "requestBody": _image_body(),
                    "responses": {
                        "200": {
                            "description": "detections in pixels of the (EXIF-upright) original image",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {
                                            "width": {"type": "integer"},
                                            "height": {"type": "integer"},
                                            "detections": {
                                                "type": "array",
                                                "items": {"$ref": "#/components/schemas/Detection"},
                                            },
                                            "threshold": {"type": "number"},
                                            "model": {"type": "object"},
                                            "device": {"type": "string"},
                                            "backend": {"type": "string"},
                                            "timing": {"type": "object"},
                                        },
                                    }
                                }
                            },
                        },
                        **_errors(400, 401, 413, 415, 429, 503),
                    },
                }
            },
            "/inference": {
                "post": {
                    "summary": "the original service's contract: parallel lists, boxes normalised x1,y1,x2,y2",
                    "security": security,
                    "parameters": [threshold],
                    "requestBody": _image_body(),
                    "responses": {
                        "200": {"description": "scores, labels, boxes"},
                        **_errors(400, 401, 413, 415, 429, 503),
                    },
                }
            },
            "/healthz": {
                "get": {
                    "summary": "the process is alive",
                    "responses": {
                        "200": {
                            "description": "alive; model: waiting, loading, ready or failed; loaded: the checkpoint in "
                            "use (file, epoch, step, global_step, mtime, class-name source); reload: with DINO_RELOAD"
                        }
                    },
                }
            },
            "/readyz": {
                "get": {
                    "summary": "model loaded and warmed up; device, backend, checkpoint",
                    "responses": {
                        "200": {"description": "ready"},
                        "503": {"description": "waiting for a model, loading or failed"},
                    },
                }
            },
            "/v1/training": {
                "get": {
                    "summary": "the training run whose checkpoint this service serves (progress.json beside it)",
                    "security": security,
                    "responses": {
                        "200": {
                            "description": "state (the trainer's, or not_started, unreadable, unavailable with a "
                            "reason), epoch, step, ETA, images/s, loss curve, evaluations, checkpoint, gpu; served: "
                            "the checkpoint in use and when it was loaded"
                        },
                        **_errors(401),
                    },
                }
            },
            "/metrics": {
                "get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text format"}}}
            },
            "/openapi.json": {"get": {"summary": "this document", "responses": {"200": {"description": "OpenAPI 3"}}}},
            **_protocol_paths(config, security),
        },
    }
