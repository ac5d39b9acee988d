"""Settings of the dataset downloader (`dinops download`). Every environment variable starts with ``DOWNLOAD_``
(credentials and the S3 endpoint may also come from boto3's own ``AWS_*`` variables)."""

from __future__ import annotations

from dinops.settings import Setting, non_negative_float, non_negative_int, positive_int

ENV_PREFIXES = ("DOWNLOAD_",)
COCO_SETS = ("train2017", "val2017", "test2017", "annotations")


def _sets(text: str) -> str:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in COCO_SETS]
    if unknown or not names:
        raise ValueError(f"choose from {', '.join(COCO_SETS)}; got {text!r}")
    return ",".join(names)


SETTINGS: tuple[Setting, ...] = (
    Setting("dest", "data/coco", "directory that receives the dataset", env="DOWNLOAD_DEST"),
    Setting("sets", "train2017,val2017,annotations", "COCO 2017 parts to fetch", type=_sets, env="DOWNLOAD_SETS"),
    Setting("urls_file", "", "file of lines 'URL [sha256:HEX or md5:HEX]', instead of COCO", env="DOWNLOAD_URLS_FILE"),
    Setting(
        "checksum_file",
        "",
        "checksums in md5sum/sha256sum format ('HEX  name'), matched by file name",
        env="DOWNLOAD_CHECKSUM_FILE",
    ),
    Setting(
        "require_checksums", False, "fail for files without a checksum", type=bool, env="DOWNLOAD_REQUIRE_CHECKSUMS"
    ),
    Setting(
        "connections", 4, "parallel connections per file (HTTP Range)", type=positive_int, env="DOWNLOAD_CONNECTIONS"
    ),
    Setting("parallel_files", 2, "files downloaded at the same time", type=positive_int, env="DOWNLOAD_PARALLEL_FILES"),
    Setting("piece_mb", 16.0, "size of one ranged request, in MiB", type=non_negative_float, env="DOWNLOAD_PIECE_MB"),
    Setting(
        "retries",
        8,
        "attempts per piece (and full re-downloads after a bad checksum: 3)",
        type=positive_int,
        env="DOWNLOAD_RETRIES",
    ),
    Setting(
        "backoff_s",
        1.0,
        "first retry delay; doubles per attempt, at most 60 s",
        type=non_negative_float,
        env="DOWNLOAD_BACKOFF_S",
    ),
    Setting(
        "timeout_s", 60.0, "connect and read timeout of one request", type=non_negative_float, env="DOWNLOAD_TIMEOUT_S"
    ),
    Setting("extract", True, "extract zip archives (atomically) after verification", type=bool, env="DOWNLOAD_EXTRACT"),
    Setting("keep_archives", False, "keep the archives after extraction", type=bool, env="DOWNLOAD_KEEP_ARCHIVES"),
    Setting(
        "subset",
        0,
        "N > 0: only the annotations and N images per split (fetched by coco_url), plus a subset annotation file",
        type=non_negative_int,
        env="DOWNLOAD_SUBSET",
    ),
    Setting("subset_seed", 0, "seed of the subset's random choice", type=int, env="DOWNLOAD_SUBSET_SEED"),
    Setting(
        "progress",
        "auto",
        "progress bars: auto (on a terminal), on or off",
        env="DOWNLOAD_PROGRESS",
        choices=("auto", "on", "off"),
    ),
    Setting("s3_source", "", "fetch the archives from s3://bucket/prefix instead of HTTP", env="DOWNLOAD_S3_SOURCE"),
    Setting("s3_dest", "", "also upload the verified archives to s3://bucket/prefix", env="DOWNLOAD_S3_DEST"),
    Setting(
        "s3_endpoint",
        "",
        "S3 endpoint URL (MinIO...); empty: boto3's AWS_ENDPOINT_URL or AWS",
        env="DOWNLOAD_S3_ENDPOINT",
    ),
    Setting("log_level", "info", "log level", env="DOWNLOAD_LOG_LEVEL", choices=("debug", "info", "warning", "error")),
    Setting(
        "log_format", "text", "json (one object per line) or text", env="DOWNLOAD_LOG_FORMAT", choices=("json", "text")
    ),
)
