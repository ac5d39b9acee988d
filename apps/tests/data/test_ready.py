"""`dinops data-ready`: the training Job's init container, run as a real process where it matters."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dinops.data import ready
from dinops.download import marker


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DINO_")}
    return {**env, **extra}


def _run(*argv: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dinops.cli", "data-ready", *argv],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_exits_0_and_says_what_the_marker_says(tmp_path):
    marker.write(tmp_path, {"sets": ["val2017", "annotations"], "subset": 5, "files": 7})
    done = _run(DINO_DATA_ROOT=str(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path / ".dinops-complete.json") in lines[0]
    assert "val2017,annotations" in lines[0] and "7 files" in lines[0] and "subset 5" in lines[0]


def test_flag_wins_over_environment(tmp_path):
    marker.write(tmp_path, {"sets": [], "subset": 0, "files": 1})
    assert _run("--data-root", str(tmp_path), DINO_DATA_ROOT=str(tmp_path / "nowhere")).returncode == 0


def test_times_out_with_exit_1(tmp_path):
    started = time.monotonic()
    result = _run("--data-root", str(tmp_path), "--wait", "0.6", "--poll", "0.1")
    assert result.returncode == 1
    assert time.monotonic() - started < 30
    assert "waiting for the dataset: " + str(tmp_path / ".dinops-complete.json") in result.stdout
    assert "is not there yet (is the download Job running?)" in result.stdout
    assert "gave up after" in result.stderr


def test_wait_from_the_environment(tmp_path):
    result = _run(DINO_DATA_ROOT=str(tmp_path), DINO_DATA_WAIT_S="0.3", DINO_DATA_POLL_S="0.1")
    assert result.returncode == 1


@pytest.mark.parametrize(
    ("text", "words"),
    [("{half", "not valid JSON"), ('{"complete": false, "files": 3}', "complete=true"), ('"yes"', "JSON object")],
)
def test_broken_marker_is_exit_2_and_says_what_is_wrong(tmp_path, text, words):
    (tmp_path / ".dinops-complete.json").write_text(text)
    result = _run("--data-root", str(tmp_path), "--wait", "5")
    assert result.returncode == 2 and words in result.stderr


@pytest.mark.parametrize("argv", [["--wait", "-1"], ["--poll", "0"], ["--wait", "soon"], ["--bogus"]])
def test_usage_errors_are_exit_2(tmp_path, argv):
    assert _run("--data-root", str(tmp_path), *argv).returncode == 2


def test_bad_environment_value_is_exit_2(tmp_path):
    result = _run(DINO_DATA_ROOT=str(tmp_path), DINO_DATA_WAIT_S="forever")
    assert result.returncode == 2 and "DINO_DATA_WAIT_S" in result.stderr


def test_waits_then_succeeds_when_the_marker_appears(tmp_path, capsys):
    def finish_download():
        time.sleep(0.5)
        marker.write(tmp_path, {"sets": ["val2017"], "subset": 0, "files": 1})

    writer = threading.Thread(target=finish_download)
    writer.start()
    started = time.monotonic()
    code = ready.main(["--data-root", str(tmp_path), "--wait", "20", "--poll", "0.05"])
    writer.join()
    assert code == 0 and 0.4 < time.monotonic() - started < 10
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("waiting for the dataset:") and out[-1].startswith("the dataset is complete:")


def test_sigterm_exits_143_promptly(tmp_path):
    command = [sys.executable, "-m", "dinops.cli", "data-ready", "--data-root", str(tmp_path), "--poll", "60"]
    with subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout.readline().startswith("waiting for the dataset:")  # it is in its wait
            sent = time.monotonic()
            process.send_signal(signal.SIGTERM)
            assert process.wait(10) == 143
            assert time.monotonic() - sent < 5
            assert "SIGTERM" in process.stderr.read()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_training_accepts_the_init_container_variables(tmp_path):
    from dinops.train.main import parse_args

    args = parse_args(["--data-root", str(tmp_path)], {"DINO_DATA_WAIT_S": "600", "DINO_DATA_POLL_S": "5"})
    assert Path(args.data_root) == tmp_path


def test_imports_only_what_the_train_image_has():
    code = (
        "import sys, dinops.data.ready; "
        "bad = [m for m in ('torch', 'flask', 'requests', 'boto3') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_docs_hold_the_settings_table():
    from dinops.settings import markdown_table

    text = (Path(__file__).resolve().parents[3] / "docs" / "training.md").read_text()
    documented = text.split("<!-- settings:data-ready -->\n", 1)[1].split("\n<!-- /settings:data-ready -->", 1)[0]
    assert documented == markdown_table(ready.SETTINGS), "regenerate the data-ready table in docs/training.md"


# /proc/self/mountinfo of `docker run -v /tmp/mi-empty:/data dinops-molecule:debian12` on the build machine: the bind
# mount of a host directory, as the Docker runtime mounts a claim's directory, and the container's root (its
# overlay options cut short).
DOCKER_MOUNTINFO = """\
82 53 0:43 / / rw,relatime master:2 - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/IHX2WF
83 82 0:46 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
103 82 254:0 /tmp/mi-empty /data rw,relatime - ext4 /dev/vda rw,discard,resv_strict,resuid=65534,resgid=65534
102 84 0:51 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=1048576k
"""


def test_the_volume_of_a_path_is_the_nearest_mount_point_above_it():
    volume = ready.volume_of(Path("/data/coco"), DOCKER_MOUNTINFO)
    assert volume == {"mount_point": "/data", "root": "/tmp/mi-empty", "fstype": "ext4", "source": "/dev/vda"}
    assert ready.volume_of(Path("/database"), DOCKER_MOUNTINFO)["mount_point"] == "/"
    escaped = "7 1 0:5 /a\\040b /mnt/my\\040data rw - nfs4 10.0.1.5:/srv/dinops/datasets rw\n"
    assert ready.volume_of(Path("/mnt/my data/coco"), escaped)["mount_point"] == "/mnt/my data"


def _as_mount_point(tmp_path: Path, monkeypatch, volume: Path) -> None:
    """The gate's view of mounts: DOCKER_MOUNTINFO with its /data bind moved to ``volume``."""
    table = tmp_path / "mountinfo"
    table.write_text(
        DOCKER_MOUNTINFO.replace(" /data ", f" {volume} ").replace(
            "/tmp/mi-empty", "/var/lib/dinops/volumes/dinops-dataset"
        )
    )
    monkeypatch.setattr(ready, "MOUNTINFO", table)


def test_a_gate_whose_volume_is_an_empty_mount_point_says_so(tmp_path, monkeypatch, capsys):
    volume = tmp_path / "data"
    volume.mkdir()
    _as_mount_point(tmp_path, monkeypatch, volume)
    assert ready.main(["--data-root", str(volume / "coco"), "--wait", "0.3", "--poll", "0.1"]) == 1
    out = capsys.readouterr().out
    assert f"{volume} is an empty mount point (ext4 /dev/vda, directory /var/lib/dinops/volumes/dinops-dataset" in out
    assert "the host's NFS export was not mounted there when Docker started this container" in out


def test_a_volume_that_holds_anything_is_not_called_empty(tmp_path, monkeypatch, capsys):
    volume = tmp_path / "data"
    (volume / "coco" / "val2017").mkdir(parents=True)
    _as_mount_point(tmp_path, monkeypatch, volume)
    assert ready.main(["--data-root", str(volume / "coco"), "--wait", "0.3", "--poll", "0.1"]) == 1
    out = capsys.readouterr().out
    assert "is not there yet (is the download Job running?)\n" in out and "empty mount point" not in out


def test_the_real_gate_on_an_empty_bind_mount_says_so(tmp_path):
    """The command as the container runs it, on a real bind mount of an empty directory (a mount namespace of its own:
    unshare(1) --user --map-root-user --mount, no privilege needed where user namespaces are allowed)."""
    if not shutil.which("unshare"):
        pytest.skip("unshare(1) (util-linux) is not installed")
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"this kernel refuses an unprivileged mount namespace: {probe.stderr.decode().strip()}")
    host_dir, volume = tmp_path / "host-dir", tmp_path / "data"
    host_dir.mkdir()
    volume.mkdir()
    gate = shlex.join([sys.executable, "-m", "dinops.cli", "data-ready", "--data-root", str(volume / "coco"),
                       "--wait", "0.3", "--poll", "0.1"])  # fmt: skip
    script = f"mount --bind {shlex.quote(str(host_dir))} {shlex.quote(str(volume))} && exec {gate}"
    result = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], env=_env(),
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert f"{volume} is an empty mount point (" in result.stdout and f"directory {host_dir} of it" in result.stdout


def test_each_waiting_line_goes_to_the_writer_with_the_output_folder(tmp_path, monkeypatch):
    """The gate hands every waiting line's reason, empty volume included, to the writer it is given (training's
    progress file, dinops.train.progress.data_ready); DINO_OUTPUT_DIR names the folder, the flag wins over it."""
    volume = tmp_path / "data"
    volume.mkdir()
    _as_mount_point(tmp_path, monkeypatch, volume)
    monkeypatch.setattr(ready, "SAY_EVERY_S", 0.1)
    monkeypatch.setenv("DINO_OUTPUT_DIR", str(tmp_path / "from-env"))
    told: list[tuple[Path, str]] = []
    argv = ["--data-root", str(volume / "coco"), "--wait", "0.5", "--poll", "0.1"]
    assert ready.main([*argv, "--output-dir", str(tmp_path / "out")], announce=lambda *a: told.append(a)) == 1
    assert len(told) >= 2 and {folder for folder, _ in told} == {tmp_path / "out"}
    why = told[0][1]
    assert why.startswith(f"waiting for the dataset's download to complete: {volume / 'coco'}/.dinops-complete.json")
    assert f"; {volume} is an empty mount point (ext4 /dev/vda" in why
    told.clear()
    assert ready.main(argv, announce=lambda *a: told.append(a)) == 1
    assert {folder for folder, _ in told} == {tmp_path / "from-env"}
    monkeypatch.delenv("DINO_OUTPUT_DIR")
    told.clear()
    assert ready.main(argv, announce=lambda *a: told.append(a)) == 1 and told == []  # no folder: nothing told
