"""The settings of `dinops train` and `dinops eval`: flag, environment variable, default.

Precedence: command-line flag > environment variable > default. Every ``DINO_*`` environment variable that
is not in this table is an error (a misspelt setting in a Kubernetes manifest fails the pod instead of being
ignored). The resolved values are written to ``OUTPUT_DIR/config.json``. Defaults are the official DINO
4-scale R50 recipe (12 epochs) on COCO 2017.
"""

from __future__ import annotations

from dinops.data.settings import CACHE_SETTINGS, DATA_PATH_SETTINGS, ENV_PREFIX
from dinops.data.settings import setting as _s
from dinops.model.ms_deform_attn_core import DEFORM_ATTN
from dinops.s3 import CHECKSUMS
from dinops.settings import Setting, non_negative_float, non_negative_int

__all__ = ["ENV_PREFIX", "PRESETS", "SETTINGS"]

PRESETS = ("dino-4scale-r50", "tiny")


SETTINGS: tuple[Setting, ...] = (
    # data (dinops.data.settings: the data commands read them too)
    *DATA_PATH_SETTINGS,
    _s("train_scales", "480,512,544,576,608,640,672,704,736,768,800", "shorter-side sizes of the multi-scale resize"),
    _s("crop_scales", "400,500,600", "shorter-side sizes before the random crop"),
    _s("crop_size", "384,600", "smallest and largest side of the random crop"),
    _s("max_size", 1333, "largest longer side after resizing (training and evaluation)", int),
    _s("eval_size", 800, "shorter-side size for evaluation", int),
    _s("num_workers", 2, "data loader worker processes per training process", int),
    _s("pin_memory", True, "pin batches in page-locked memory (GPU only)", bool),
    *CACHE_SETTINGS,
    # model
    _s("model", "dino-4scale-r50", "model preset", choices=PRESETS),
    _s("model_overrides", "", "comma-separated DINOConfig overrides, e.g. 'hidden_dim=128,dec_layers=2'"),
    _s("num_classes", 0, "class count; 0 = derived from the training annotations (max category id + 1)", int),
    _s(
        "pretrained",
        "",
        "initialise from this checkpoint (official DINO or dinops); class heads reset if counts differ",
    ),
    _s("backbone_weights", "", "ImageNet backbone state dict file (torchvision ResNet layout)"),
    # optimisation
    _s("epochs", 12, "number of epochs", int),
    _s("batch_size", 2, "images per process per step", int),
    _s(
        "accum_steps",
        1,
        "micro-batches accumulated per optimizer step (effective batch = batch x accum x processes)",
        int,
    ),
    _s("lr", 1e-4, "AdamW learning rate of the transformer and heads", float),
    _s("lr_backbone", 1e-5, "AdamW learning rate of the backbone (0 freezes it)", float),
    _s("weight_decay", 1e-4, "AdamW weight decay", float),
    _s("clip_max_norm", 0.1, "gradient clipping max norm (0 = off)", float),
    _s("lr_drop", "11", "comma-separated epochs at which the learning rate is multiplied by 0.1"),
    _s("warmup_steps", 0, "linear learning-rate warm-up over this many optimizer steps", int),
    _s("amp", "none", "mixed precision on GPU", choices=("none", "bf16", "fp16")),
    _s("tf32", True, "allow TF32 matrix multiplies on Ampere and newer GPUs", bool),
    _s("channels_last", True, "convolutions in channels-last memory layout (GPU only)", bool),
    _s("seed", 42, "random seed", int),
    _s("deterministic", False, "deterministic algorithms (bitwise-reproducible resume on CPU; slower)", bool),
    _s("device", "auto", "device", choices=("auto", "cpu", "cuda")),
    _s("max_steps", 0, "stop after this many optimizer steps in total (0 = run all epochs)", int),
    # checkpoints and evaluation
    _s("output_dir", "output", "checkpoints, log.txt, console.log, config.json, TensorBoard events"),
    _s("resume", "", "'auto' (latest in OUTPUT_DIR if any), a checkpoint path, or empty"),
    _s("checkpoint_every", 1, "keep a numbered checkpoint every K epochs (and at each learning-rate drop)", int),
    _s("checkpoint_steps", 1000, "also update the latest checkpoint every N optimizer steps (0 = per epoch only)", int),
    _s(
        "output_s3",
        "",
        "s3://bucket/prefix: also upload checkpoints, log.txt and config.json there; --resume auto fetches the "
        "latest from it when OUTPUT_DIR has none (empty = off)",
    ),
    _s("s3_endpoint", "", "S3 endpoint URL (MinIO...); empty = AWS, or boto3's AWS_ENDPOINT_URL"),
    _s(
        "s3_checksums",
        "auto",
        "botocore's request checksums and response validation: auto = when_required with a custom endpoint (stores "
        "that refuse x-amz-checksum-* headers), botocore's when_supported for AWS",
        choices=CHECKSUMS,
    ),
    _s(
        "s3_retry_minutes",
        30.0,
        "retry failed uploads (exponential backoff, training goes on) for this long since the first failure, then "
        "exit 75",
        non_negative_float,
    ),
    _s("eval_every", 1, "evaluate on the validation split every K epochs (0 = never during training)", int),
    _s("eval", False, "only evaluate the model (from --resume or --pretrained) and exit", bool),
    _s("num_select", 0, "detections kept per image for evaluation (0 = the model's num_select)", int),
    # logging
    _s("print_freq", 50, "console line every N steps", int),
    _s("tensorboard", True, "write TensorBoard events to OUTPUT_DIR/tensorboard", bool),
    _s("profile_steps", 0, "record a PyTorch profiler trace of this many steps into OUTPUT_DIR/profile", int),
    _s("progress", False, "a progress bar during evaluation (for a person at a terminal)", bool),
    Setting(
        "metrics_port",
        9109,
        "Prometheus metrics of process 0 on this port, all addresses, /metrics (0 = off); OUTPUT_DIR/progress.json is "
        "written either way",
        type=non_negative_int,
        env="DINO_TRAIN_METRICS_PORT",
    ),
)

# Read from the environment by the model itself, not by the app (docs/model.md): accepted, checked at start, no flag.
MODEL_ENV: tuple[Setting, ...] = (DEFORM_ATTN,)
