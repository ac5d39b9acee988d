"""Settings of the inference API (`dinops serve`): one table, read by the CLI, the app factory and the tests.

Every environment variable starts with ``DINO_``; an unknown ``DINO_*`` variable stops the server at start-up
(see :func:`dinops.settings.check_unknown_env`), so a misspelt name in a manifest cannot go unnoticed. The value
checkers are the shared ones of :mod:`dinops.settings`.
"""

from __future__ import annotations

import re

from dinops.settings import Setting, fraction, non_negative_float, non_negative_int, positive_float, positive_int

ENV_PREFIXES = ("DINO_",)


def model_name(text: str) -> str:
    """A name that goes into URL paths as it is (``/v2/models/<name>/infer``, ``/v1/models/<name>:predict``)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", text):
        raise ValueError(
            f"must be 1 to 128 letters, digits, '_', '.' or '-', starting with a letter or digit, got {text!r}"
        )
    return text


SETTINGS: tuple[Setting, ...] = (
    # Model
    Setting(
        "checkpoint",
        "",
        "checkpoint file (official DINO or dinops training output), or s3://bucket/key.pth, or s3://bucket/prefix/ "
        "(the latest checkpoint that `dinops train --output-s3` published there)",
        env="DINO_CHECKPOINT",
    ),
    Setting(
        "s3_endpoint",
        "",
        "S3 endpoint URL (MinIO...); empty = AWS, or boto3's AWS_ENDPOINT_URL",
        env="DINO_S3_ENDPOINT",
    ),
    Setting(
        "s3_cache_dir",
        "",
        "folder for checkpoints downloaded from S3 (empty: the system's temporary folder)",
        env="DINO_S3_CACHE_DIR",
    ),
    Setting(
        "config",
        "",
        "model configuration (JSON or an official DINO .py config); empty: the checkpoint's own args",
        env="DINO_CONFIG",
    ),
    Setting(
        "model_name",
        "dino",
        "the model's name in the paths of KServe V1 (/v1/models/dino:predict) and of the Open Inference Protocol V2 "
        "(/v2/models/dino/infer); letters, digits, '_', '.', '-'",
        type=model_name,
        env="DINO_MODEL_NAME",
    ),
    Setting("device", "auto", "auto (first GPU if there is one, else CPU), cpu, cuda or cuda:N", env="DINO_DEVICE"),
    Setting(
        "precision",
        "auto",
        "auto: bf16 on a CPU with native bfloat16 (AVX-512 BF16 or AMX: AP -0.0017 on the learning proof's model, "
        "docs/model.md), fp32 elsewhere, GPUs included; fp32; bf16 autocast on a GPU or on a CPU with native "
        "bfloat16 (refused on other CPUs); fp16 autocast on a GPU only",
        env="DINO_PRECISION",
        choices=("auto", "fp32", "bf16", "fp16"),
    ),
    Setting(
        "class_names",
        "",
        "file with class names (JSON list/dict, COCO categories, or one per line)",
        env="DINO_CLASS_NAMES",
    ),
    Setting(
        "min_size",
        800,
        "resize the shorter image side to this many pixels (as evaluation)",
        type=positive_int,
        env="DINO_MIN_SIZE",
    ),
    Setting(
        "max_size",
        1333,
        "cap on the longer image side after resizing (as evaluation)",
        type=positive_int,
        env="DINO_MAX_SIZE",
    ),
    Setting(
        "num_select",
        300,
        "top-k candidates taken from the model's queries before thresholding",
        type=positive_int,
        env="DINO_NUM_SELECT",
    ),
    Setting(
        "torch_threads",
        0,
        "CPU threads of torch's operators (0: the container's CPU limit, rounded up, else the usable cores)",
        type=non_negative_int,
        env="DINO_TORCH_THREADS",
    ),
    Setting(
        "fast_path",
        True,
        "the fast inference path: batch norm folded into the convolutions, channels-last backbone, encoder in token "
        "chunks (docs/model.md); false: the reference path as trained",
        type=bool,
        env="DINO_FAST_PATH",
    ),
    Setting("warmup", True, "run one forward pass before reporting ready", type=bool, env="DINO_WARMUP"),
    Setting(
        "wait_for_model",
        False,
        "if the checkpoint does not exist yet: serve anyway ('waiting for a model': healthy, not ready, 503 on "
        "detection) and load it once it appears; false: exit 2",
        type=bool,
        env="DINO_WAIT_FOR_MODEL",
    ),
    Setting(
        "reload",
        "auto",
        "follow the checkpoint file: when it is replaced (new inode, size or mtime; in S3 a new ETag or manifest), "
        "load the new one in the background and swap it in; a failed reload keeps the loaded model. auto: on with "
        "--wait-for-model",
        env="DINO_RELOAD",
        choices=("auto", "true", "false"),
    ),
    Setting(
        "model_poll_s",
        5.0,
        "seconds between two looks at the checkpoint file (waiting for it, a new one after a failed load, "
        "or a replaced one with --reload)",
        type=positive_float,
        env="DINO_MODEL_POLL_S",
    ),
    # Answers
    Setting(
        "threshold", 0.3, "default score threshold of /v1/detect and /inference", type=fraction, env="DINO_THRESHOLD"
    ),
    Setting(
        "max_detections",
        100,
        "default (and upper bound of) max_detections per image",
        type=positive_int,
        env="DINO_MAX_DETECTIONS",
    ),
    # Batching
    Setting(
        "batch_max_size",
        8,
        "most images in one forward pass (1 turns batching off)",
        type=positive_int,
        env="DINO_BATCH_MAX_SIZE",
    ),
    Setting(
        "cpu_batch_max_size",
        1,
        "most images in one forward pass when the model runs on a CPU (at most batch_max_size): batching earned "
        "nothing there (docs/api.md, Speed); raise it on CPUs with many cores and small images",
        type=positive_int,
        env="DINO_CPU_BATCH_MAX_SIZE",
    ),
    Setting(
        "batch_max_wait_ms",
        0.0,
        "longest wait for more images before a batch runs (0: a batch takes what is queued when the model is free)",
        type=non_negative_float,
        env="DINO_BATCH_MAX_WAIT_MS",
    ),
    Setting(
        "queue_size",
        64,
        "images waiting for the model; beyond it requests get 503",
        type=positive_int,
        env="DINO_QUEUE_SIZE",
    ),
    Setting(
        "request_timeout_s",
        30.0,
        "longest wait of one request for its result",
        type=non_negative_float,
        env="DINO_REQUEST_TIMEOUT_S",
    ),
    # Limits and access
    Setting(
        "max_upload_mb",
        20.0,
        "largest accepted request body, in MiB",
        type=non_negative_float,
        env="DINO_MAX_UPLOAD_MB",
    ),
    Setting(
        "max_image_pixels",
        25_000_000,
        "most pixels decoded per image (width x height; a JPEG counts after its DCT scaling toward the model's size, "
        "so larger photos pass): a 24-MP camera frame fits, while the model sees at most DINO_MAX_SIZE x "
        "DINO_MIN_SIZE",
        type=positive_int,
        env="DINO_MAX_IMAGE_PIXELS",
    ),
    Setting(
        "max_image_mb",
        128.0,
        "most memory, in MiB, that decoding one image and converting it to RGB may take, computed from its header "
        "(size, bits per sample, channels) before any pixel is decoded; beyond it 413",
        type=positive_float,
        env="DINO_MAX_IMAGE_MB",
    ),
    Setting(
        "max_images_per_request",
        16,
        "most images in one request (KServe V1 instances, Open Inference Protocol V2 elements; never more than "
        "DINO_QUEUE_SIZE); beyond it 413",
        type=positive_int,
        env="DINO_MAX_IMAGES_PER_REQUEST",
    ),
    Setting(
        "max_decoded_mb",
        512.0,
        "memory, in MiB, of the images a worker holds at once (being decoded or waiting for the model, as computed "
        "from their headers); a request that does not fit waits for room up to DINO_REQUEST_TIMEOUT_S, then 429; "
        "one that could never fit gets 413",
        type=positive_float,
        env="DINO_MAX_DECODED_MB",
    ),
    Setting(
        "decode_threads",
        2,
        "images a worker decodes at the same time; the other request threads wait their turn",
        type=positive_int,
        env="DINO_DECODE_THREADS",
    ),
    Setting("api_token", "", "bearer token required by the detection endpoints (empty: no auth)", env="DINO_API_TOKEN"),
    Setting(
        "cors_origins",
        "",
        "comma-separated origins allowed by CORS, or * (empty: no CORS headers)",
        env="DINO_CORS_ORIGINS",
    ),
    # Server
    Setting("bind", "0.0.0.0:8000", "address:port to listen on", env="DINO_BIND"),
    Setting(
        "workers",
        1,
        "gunicorn worker processes (each holds one model; one per GPU)",
        type=positive_int,
        env="DINO_WORKERS",
    ),
    Setting("threads", 32, "request threads per worker (they feed the batcher)", type=positive_int, env="DINO_THREADS"),
    Setting("log_level", "info", "log level", env="DINO_LOG_LEVEL", choices=("debug", "info", "warning", "error")),
    Setting(
        "log_format", "json", "json (one object per line) or text", env="DINO_LOG_FORMAT", choices=("json", "text")
    ),
)
