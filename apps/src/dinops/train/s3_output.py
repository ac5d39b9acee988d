"""A copy of the training output in S3 (``--output-s3 s3://bucket/prefix``, ``DINO_OUTPUT_S3``), for VMs that go away.

Layout under the prefix (the names of OUTPUT_DIR, plus the latest pointer)::

    latest.json                         the manifest: key, size, sha256, epoch, step, global_step of the latest
    latest/checkpoint-g00000012.pth     latest checkpoints, one key per global step (the newest two are kept)
    checkpoint0000.pth ...              numbered checkpoints (every --checkpoint-every epochs)
    checkpoint_best_regular.pth         the best by bbox AP
    log.txt  config.json  console.log   (console.log at the end)  eval.json (dinops eval)

Every object carries its sha256 as ``x-amz-meta-dinops-sha256``.

Atomic for readers: a PUT of one key is atomic (:mod:`dinops.s3`), so a checkpoint is uploaded under its own key
and ``latest.json`` is written only after it is complete: an upload cut anywhere leaves the manifest pointing at the
previous, complete checkpoint; a reader never sees a pointer to a missing or half object.

Not blocking training: rank 0 hands each file to one background thread. A checkpoint is handed over as a hard link
(the training loop replaces ``checkpoint.pth`` by a rename, the link keeps the bytes of that moment); small files as
their bytes. A latest checkpoint still waiting when a newer one comes is dropped: only the newest matters.

Failures: botocore retries each request (standard mode). An upload that still fails is logged at once as an error;
training stops at the next checkpoint (after writing it locally) and exits 1, and at the end of a run every pending
upload is waited for and a failure makes the exit status 1: never 0 with data missing in S3. OUTPUT_DIR is complete
in every case; ``--resume auto`` continues and uploads what S3 lacks.

Resume on a new VM: with ``--resume auto`` and no ``checkpoint.pth`` in OUTPUT_DIR, the manifest's checkpoint is
downloaded (size and sha256 checked, renamed into place) with ``log.txt``, and training continues from its step.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import logging
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from dinops import s3
from dinops.settings import SettingsError
from dinops.train import checkpoints, dist
from dinops.train.engine import StepState

log = logging.getLogger(__name__)

LATEST_DIR = "latest"
STAGING = ".s3-upload"  # hard links of the checkpoints waiting for their upload
CATCH_UP = ("log.txt", checkpoints.BEST)
MULTIPART_BYTES = 64 << 20  # larger files go in 8 MiB parts (s3transfer's default), 4 at a time


@dataclass
class _Job:
    name: str  # key relative to the prefix
    path: Path | None = None  # a staged file, or
    data: bytes | None = None  # the bytes of a small file
    position: StepState | None = None  # set for the latest checkpoint: a manifest follows the upload


def latest_key(global_step: int) -> str:
    return f"{LATEST_DIR}/checkpoint-g{global_step:08d}.pth"


class S3Output:
    """The uploader of one training process; inactive (every method returns at once) without ``--output-s3``."""

    def __init__(self, url: str, endpoint: str, output_dir: Path, rank: int) -> None:
        self.active = bool(url)
        self.uploads = self.active and rank == 0
        self.output_dir = output_dir
        self.failure = ""
        self._jobs: collections.deque[_Job] = collections.deque()
        self._cond = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None
        self._serial = 0
        if not self.active:
            return
        self.location = s3.parse_url(url, "--output-s3 (DINO_OUTPUT_S3)")
        self.client = s3.make_client(endpoint)
        from boto3.s3.transfer import TransferConfig

        self.transfer = TransferConfig(multipart_threshold=MULTIPART_BYTES, max_concurrency=4)

    @classmethod
    def start(cls, args: argparse.Namespace, output_dir: Path, rank: int) -> S3Output:
        """Check access with one cheap call on every process, before any training: wrong credentials, a missing
        bucket or an unreachable endpoint is a usage error (exit 2) naming the setting."""
        mirror = cls(args.output_s3, args.s3_endpoint, output_dir, rank)
        if mirror.active:
            try:
                s3.check_access(mirror.client, mirror.location)
            except s3.S3Error as exc:
                raise SettingsError(f"--output-s3 (DINO_OUTPUT_S3) {args.output_s3}: {exc}") from None
            log.info("output mirrored to %s", mirror.location)
        if mirror.uploads:
            shutil.rmtree(output_dir / STAGING, ignore_errors=True)  # links left by a killed run
            (output_dir / STAGING).mkdir(parents=True)
            mirror._thread = threading.Thread(target=mirror._work, name="dinops-s3-upload", daemon=True)
            mirror._thread.start()
        return mirror

    # --- resume ---------------------------------------------------------------------------------------------------

    def restore(self) -> None:
        """A new VM: no local latest checkpoint. Fetch the manifest's, verified, and ``log.txt``; then every process
        goes on with ``--resume auto`` as if the files had always been here."""
        error = ""
        try:
            if self.uploads and not (self.output_dir / checkpoints.LATEST).is_file():
                self._fetch_latest()
        except s3.S3Error as exc:
            error = f"--resume auto from {self.location}: {exc}"
        if self.active and (error := dist.broadcast_object(error)):  # every process stops, none waits for rank 0
            raise s3.S3Error(error)

    def _fetch_latest(self) -> None:
        manifest = s3.Manifest.read(self.client, self.location)
        if manifest is None:
            log.info("no checkpoint in %s either: a fresh start", self.location)
            return
        target = self.output_dir / checkpoints.LATEST
        s3.download_verified(
            self.client, self.location.bucket, manifest.key, target, manifest.size, manifest.sha256, self.transfer
        )
        log.info(
            "restored %s (epoch %d step %d, sha256 %s) from %s",
            target, manifest.epoch, manifest.step, manifest.sha256[:12], self.location.url(manifest.key),
        )  # fmt: skip
        log_txt = self.output_dir / "log.txt"
        data = s3.get_bytes(self.client, self.location.bucket, self.location.key("log.txt"))
        if data is not None and not log_txt.exists():
            log_txt.write_bytes(data)

    def catch_up(self, state: StepState) -> None:
        """After a resume from local files: upload what S3 lacks (a latest checkpoint newer than the manifest's, a
        best checkpoint or log.txt missing or of another size), e.g. after a failed upload or a killed uploader."""
        if not self.uploads:
            return
        manifest = s3.Manifest.read(self.client, self.location)
        if (self.output_dir / checkpoints.LATEST).is_file() and (
            manifest is None or manifest.global_step < state.global_step
        ):
            self.checkpoint(self.output_dir / checkpoints.LATEST, state)
        for name in CATCH_UP:
            path = self.output_dir / name
            if path.is_file():
                head = s3.head(self.client, self.location.bucket, self.location.key(name))
                if head is None or head["ContentLength"] != path.stat().st_size:
                    if name.endswith(".pth"):
                        self.checkpoint(path)
                    else:
                        self.file(path)

    # --- what training hands over ---------------------------------------------------------------------------------

    def checkpoint(self, path: Path, position: StepState | None = None) -> None:
        """Upload a checkpoint as it is now: under its own name, or with ``position`` (the latest checkpoint) under a
        key of its global step, followed by the manifest."""
        if not self.uploads or self.failure:  # training stops at this checkpoint: nothing more goes up
            return
        self._serial += 1
        staged = self.output_dir / STAGING / f"{self._serial:06d}-{path.name}"
        checkpoints.keep_copy(path, staged)
        snapshot = None if position is None else StepState(position.epoch, position.step, position.global_step)
        name = latest_key(position.global_step) if position is not None else path.name
        self._put(_Job(name, path=staged, position=snapshot))

    def file(self, path: Path) -> None:
        """Upload a small file (log.txt, config.json...) with its content of now."""
        if self.uploads:
            self._put(_Job(path.name, data=path.read_bytes()))

    def raise_if_failed(self) -> None:
        """On every process: raise :class:`s3.S3Error` when an upload of rank 0 has failed."""
        if self.active and (failure := dist.broadcast_object(self.failure)):
            self._drain()  # an upload still under way finishes (or is aborted) before the process goes
            raise s3.S3Error(
                f"{failure}; OUTPUT_DIR {self.output_dir} holds everything: `--resume auto` continues and uploads "
                "what the bucket lacks"
            )

    def finish(self) -> None:
        """Wait for every upload (console.log last); raise if one failed."""
        if self.uploads:
            console = self.output_dir / "console.log"
            if console.is_file():
                self.file(console)
            self._drain()
            log.info("uploads to %s complete%s", self.location, " with a failure" if self.failure else "")
        self.raise_if_failed()

    def _drain(self) -> None:
        """Wait until the upload thread has nothing queued or under way (rank 0; other ranks have no thread)."""
        if self.uploads:
            with self._cond:
                while self._jobs or self._busy:
                    self._cond.wait()

    # --- the upload thread ----------------------------------------------------------------------------------------

    def _put(self, job: _Job) -> None:
        with self._cond:
            if job.position is not None:  # an older latest checkpoint not started yet is superseded
                for old in [j for j in self._jobs if j.position is not None]:
                    self._jobs.remove(old)
                    old.path.unlink(missing_ok=True)
            self._jobs.append(job)
            self._cond.notify_all()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                job = self._jobs.popleft()
                self._busy = True
            try:
                self._upload(job)
            except s3.S3Error as exc:
                self.failure = self.failure or str(exc)
                log.error("S3 upload failed: %s (training stops at the next checkpoint)", exc)
            except Exception as exc:  # the thread must survive to report, whatever broke
                self.failure = self.failure or f"uploading {job.name}: {type(exc).__name__}: {exc}"
                log.exception("S3 upload of %s failed", job.name)
            finally:
                if job.path is not None:
                    job.path.unlink(missing_ok=True)
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _upload(self, job: _Job) -> None:
        bucket, key = self.location.bucket, self.location.key(job.name)
        if job.data is not None:
            s3.put_bytes(self.client, job.data, bucket, key)
            return
        sha256 = s3.upload_file(self.client, job.path, bucket, key, transfer=self.transfer)
        if job.position is None:
            log.info("uploaded %s", self.location.url(key))
            return
        previous = s3.Manifest.read(self.client, self.location)
        manifest = s3.Manifest(
            key=key,
            size=job.path.stat().st_size,
            sha256=sha256,
            epoch=job.position.epoch,
            step=job.position.step,
            global_step=job.position.global_step,
            written_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        )
        manifest.write(self.client, self.location)  # the last write: from now on readers get this checkpoint
        log.info(
            "uploaded %s; %s points to it", self.location.url(key), self.location.url(self.location.key(s3.MANIFEST))
        )
        keep = {key} | ({previous.key} if previous else set())  # a reader may still be fetching the previous one
        older = self.location.key(LATEST_DIR + "/")
        try:
            listing = self.client.list_objects_v2(Bucket=bucket, Prefix=older)
        except s3.client_errors() as exc:
            raise s3.failure(self.client, "listing", bucket, older, exc) from exc
        for entry in listing.get("Contents", []):
            if entry["Key"] not in keep:
                s3.delete(self.client, bucket, entry["Key"])
