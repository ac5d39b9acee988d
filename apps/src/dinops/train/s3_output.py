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

Start: on rank 0 a probe object is put and deleted and one multipart upload created and aborted (what an upload needs,
not only a listing), and multipart uploads under the prefix left by a killed run are aborted (:data:`STALE_UPLOAD`).

Outages are waited out: botocore retries each request (standard mode); an upload that still fails is tried again by
the upload thread with exponential backoff (:class:`Backoff`) while training goes on, for at most
``--s3-retry-minutes`` counted from the first failure since the last success. A newer latest checkpoint supersedes a
queued or retried older one; the staged link of a checkpoint is kept until its upload succeeds, and a checkpoint in
OUTPUT_DIR is never deleted. When the window is spent, training stops at the next checkpoint (written locally) and exits
:data:`EXIT_S3_UNREACHABLE`; an error that is not S3's (a bug) exits 1. At the end of a run every pending upload is
waited for (within the window): never 0 with data missing in S3. ``--resume auto`` continues and uploads what S3 lacks
(:meth:`S3Output.catch_up`, by sha256).

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
import time
from dataclasses import dataclass
from pathlib import Path

from dinops import s3
from dinops.digests import file_sha256
from dinops.settings import SettingsError
from dinops.train import checkpoints, dist
from dinops.train.engine import StepState

log = logging.getLogger(__name__)

LATEST_DIR = "latest"
STAGING = ".s3-upload"  # hard links of the checkpoints waiting for their upload
CATCH_UP = ("log.txt", "config.json")  # besides every checkpoint*.pth
MULTIPART_BYTES = 64 << 20  # larger files go in 8 MiB parts (s3transfer's default), 4 at a time
# sysexits.h EX_TEMPFAIL ("a temporary failure ... the user is invited to retry later"): apart from 1 (an error),
# 2 (usage) and 128+n (a signal), so that a Job's podFailurePolicy or an operator can tell "S3 was down" apart.
EXIT_S3_UNREACHABLE = 75
# Multipart uploads under the prefix older than this are a killed run's (ours finish or abort well within the
# retry window); younger ones may belong to a live writer.
STALE_UPLOAD = datetime.timedelta(hours=6)


class S3Unreachable(s3.S3Error):
    """Uploads kept failing for longer than ``--s3-retry-minutes``."""


@dataclass
class _Job:
    name: str  # key relative to the prefix
    path: Path | None = None  # a staged file, or
    data: bytes | None = None  # the bytes of a small file
    position: StepState | None = None  # set for the latest checkpoint: a manifest follows the upload
    attempts: int = 0  # failed attempts so far
    not_before: float = 0.0  # time.monotonic() of the next attempt


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff bounded by time: the delays double from ``window/1800`` up to ``window/30`` (1 s to 60 s for
    the default 30 minutes), so a shorter window retries proportionally faster."""

    window_s: float

    def delay(self, attempts: int) -> float:
        longest = self.window_s / 30
        return min(longest, self.window_s / 1800 * 2 ** (attempts - 1))


def latest_key(global_step: int) -> str:
    return f"{LATEST_DIR}/checkpoint-g{global_step:08d}.pth"


class S3Output:
    """The uploader of one training process; inactive (every method returns at once) without ``--output-s3``."""

    def __init__(
        self, url: str, endpoint: str, output_dir: Path, rank: int, retry_minutes: float = 30.0, checksums: str = "auto"
    ) -> None:
        self.active = bool(url)
        self.uploads = self.active and rank == 0
        self.output_dir = output_dir
        self.failure = ""
        self.unreachable = False  # the failure is the retry window spent, not an error
        self.backoff = Backoff(retry_minutes * 60)
        self._failing_since: float | None = None  # time.monotonic() of the first failure since the last success
        self._jobs: collections.deque[_Job] = collections.deque()
        self._cond = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None
        self._serial = 0
        if not self.active:
            return
        self.location = s3.parse_url(url, "--output-s3 (DINO_OUTPUT_S3)")
        self.client = s3.make_client(endpoint, checksums=checksums)
        from boto3.s3.transfer import TransferConfig

        self.transfer = TransferConfig(multipart_threshold=MULTIPART_BYTES, max_concurrency=4)

    @classmethod
    def start(cls, args: argparse.Namespace, output_dir: Path, rank: int) -> S3Output:
        """Check access before any training, a listing on every process and on rank 0 writing (a probe object and a
        multipart upload): wrong credentials, a missing bucket or permission, an unreachable endpoint or a store that
        refuses our requests is a usage error (exit 2) naming the setting and the cause."""
        mirror = cls(args.output_s3, args.s3_endpoint, output_dir, rank, args.s3_retry_minutes, args.s3_checksums)
        if mirror.active:
            error = ""
            try:
                s3.check_access(mirror.client, mirror.location)
                if mirror.uploads:
                    s3.check_write(mirror.client, mirror.location)
            except s3.S3Error as exc:
                error = f"--output-s3 (DINO_OUTPUT_S3) {args.output_s3}: {exc}"
            if error := dist.broadcast_object(error):  # every process stops, none waits for rank 0
                raise SettingsError(error)
            log.info("output mirrored to %s", mirror.location)
        if mirror.uploads:
            mirror._abort_stale_uploads()
            shutil.rmtree(output_dir / STAGING, ignore_errors=True)  # links left by a killed run
            (output_dir / STAGING).mkdir(parents=True)
            mirror._thread = threading.Thread(target=mirror._work, name="dinops-s3-upload", daemon=True)
            mirror._thread.start()
        return mirror

    def _abort_stale_uploads(self) -> None:
        try:
            aborted = s3.abort_stale_uploads(self.client, self.location, STALE_UPLOAD)
        except s3.S3Error as exc:  # the cleanup is a saving, not a condition: a lifecycle rule may do it instead
            log.warning("%s (docs/data.md: a lifecycle rule does this too)", exc)
            return
        for key in aborted:
            log.info("aborted an incomplete multipart upload of %s left by an earlier run", self.location.url(key))

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
        """After a resume from local files: upload what S3 lacks (a latest checkpoint newer than the manifest's; every
        other ``checkpoint*.pth``, log.txt and config.json missing or whose stored sha256 is not the local file's),
        e.g. after uploads given up during an outage or a killed uploader. Two checkpoints of one model have the same
        size: only the content tells a stale best checkpoint from the current one."""
        if not self.uploads:
            return
        manifest = s3.Manifest.read(self.client, self.location)
        if (self.output_dir / checkpoints.LATEST).is_file() and (
            manifest is None or manifest.global_step < state.global_step
        ):
            self.checkpoint(self.output_dir / checkpoints.LATEST, state)
        saved = sorted(p.name for p in self.output_dir.glob("checkpoint*.pth") if p.name != checkpoints.LATEST)
        for name in (*saved, *CATCH_UP):
            path = self.output_dir / name
            if not path.is_file():
                continue
            head = s3.head(self.client, self.location.bucket, self.location.key(name))
            if (head or {}).get("Metadata", {}).get(s3.SHA256_METADATA) != file_sha256(path):
                log.info("catching up %s: not in %s or not the same content", name, self.location)
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
        """On every process: raise :class:`S3Unreachable` when rank 0 gave up retrying (the window is spent),
        :class:`s3.S3Error` when an upload failed otherwise."""
        if not self.active:
            return
        failure, unreachable = dist.broadcast_object((self.failure, self.unreachable))
        if failure:
            self._drain()  # an upload still under way finishes (or is aborted) before the process goes
            error = S3Unreachable if unreachable else s3.S3Error
            raise error(
                f"{failure}; OUTPUT_DIR {self.output_dir} holds everything: `--resume auto` continues and uploads "
                "what the bucket lacks"
            )

    def finish(self) -> None:
        """Wait for every upload (console.log last); raise if one failed."""
        if self.uploads:
            console = self.output_dir / "console.log"
            if console.is_file():
                self.file(console)
            if self._jobs or self._busy:
                log.info("waiting for the uploads to %s (retried for at most %.0f min)", self.location,
                         self.backoff.window_s / 60)  # fmt: skip
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

    def _next_job(self) -> _Job:
        with self._cond:
            while True:
                wait = self._jobs[0].not_before - time.monotonic() if self._jobs else None
                if wait is not None and wait <= 0:
                    self._busy = True
                    return self._jobs.popleft()
                self._cond.wait(wait)  # a new job, or the time of the next retry

    def _work(self) -> None:
        while True:
            job = self._next_job()
            again = False
            try:
                self._upload(job)
                self._failing_since = None
            except s3.S3Error as exc:
                again = self._retry_later(job, exc)
            except Exception as exc:  # the thread must survive to report, whatever broke
                self.failure = self.failure or f"uploading {job.name}: {type(exc).__name__}: {exc}"
                log.exception("S3 upload of %s failed", job.name)
            with self._cond:
                newer = any(j.position is not None for j in self._jobs)
                if again and not (job.position is not None and newer):  # else superseded by a newer latest
                    self._jobs.appendleft(job)
                elif job.path is not None:
                    job.path.unlink(missing_ok=True)
                if self.failure:  # given up: nothing more goes up (OUTPUT_DIR keeps every file)
                    for dropped in self._jobs:
                        if dropped.path is not None:
                            dropped.path.unlink(missing_ok=True)
                    self._jobs.clear()
                self._busy = False
                self._cond.notify_all()

    def _retry_later(self, job: _Job, exc: s3.S3Error) -> bool:
        """Schedule the next attempt of ``job``; False (and the failure set) once the retry window is spent."""
        now = time.monotonic()
        self._failing_since = now if self._failing_since is None else self._failing_since
        left = self._failing_since + self.backoff.window_s - now
        if left <= 0:
            if not self.failure:
                self.failure = (
                    f"S3 unreachable for {self.backoff.window_s / 60:g} min (--s3-retry-minutes, "
                    f"DINO_S3_RETRY_MINUTES); the last error: {exc}"
                )
                self.unreachable = True
            log.error("S3 upload failed: %s (training stops at the next checkpoint)", self.failure)
            return False
        job.attempts += 1
        delay = min(self.backoff.delay(job.attempts), left)
        job.not_before = now + delay
        log.warning(
            "S3 upload failed: %s; attempt %d again in %.1f s (training goes on; giving up in %.0f s)",
            exc, job.attempts + 1, delay, left,
        )  # fmt: skip
        return True

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
