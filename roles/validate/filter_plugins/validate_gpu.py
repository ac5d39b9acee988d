"""The gpu_host section's two decisions that need more than a comparison, each as {status, detail}:

- dinops_driver_runs_images: whether the loaded driver's branch runs the CUDA runtime the serve/train images carry,
  by the compatibility contract (facts/nvidia.yml: images.cuda_runtime, cuda_min_branch, default_branch);
- dinops_cuda_in_image: what files/cuda_in_image.py reported from a `docker run --gpus all` of the serve image.

A host without an NVIDIA GPU gets skip, never pass.
"""

from __future__ import annotations

import json
import re

from ansible.errors import AnsibleFilterError

NO_GPU = "no NVIDIA GPU on the PCI bus"
SKIP = {"status": "skip", "detail": NO_GPU}


def _result(ok: bool, detail: str) -> dict[str, str]:
    return {"status": "pass" if ok else "fail", "detail": detail}


def images_min_branch(contract) -> tuple[str, int, int]:
    """(the images' CUDA runtime, the oldest branch that runs it, the branch to advise) from the contract."""
    try:
        runtime = str(contract["images"]["cuda_runtime"])
        needed = int(contract["cuda_min_branch"][runtime.split(".")[0]])
        default = int(contract.get("default_branch", needed))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise AnsibleFilterError(
            f"the NVIDIA contract must give images.cuda_runtime and its major in cuda_min_branch: {exc!r}"
        ) from exc
    return runtime, needed, max(default, needed)


def dinops_driver_runs_images(driver_version, contract, gpus) -> dict[str, str]:
    """The loaded driver ('580.95.05', '' when none is loaded) against the images' CUDA runtime."""
    if int(gpus) == 0:
        return dict(SKIP)
    runtime, needed, advised = images_min_branch(contract)
    fix = f"set nvidia_driver_branch to {advised} and run the gpu_hosts stage"
    match = re.match(r"([0-9]+)\.", str(driver_version or ""))
    if not match:
        return _result(False, f"no NVIDIA driver loaded to run the images' CUDA {runtime} runtime: {fix}")
    branch = int(match.group(1))
    if branch < needed:
        return _result(
            False,
            f"driver {driver_version} cannot run the images' CUDA {runtime} runtime (needs branch >= {needed}): {fix}",
        )
    return _result(
        True,
        f"driver {driver_version} (branch {branch}) runs the images' CUDA {runtime} runtime (needs branch >= {needed})",
    )


def probe_report(stdout: str) -> dict | None:
    """The last stdout line that is a JSON object (what files/cuda_in_image.py prints), or None."""
    for line in reversed(str(stdout or "").splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict):
            return report
    return None


def _last_line(text) -> str:
    """The line that says what went wrong: Docker's own error ('docker: Error response from daemon: ...', followed
    by a usage hint), else the last line (a traceback's exception, a module's message)."""
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    docker_errors = [line for line in lines if line.startswith("docker: ")]
    return (docker_errors or lines or [""])[-1]


def dinops_cuda_in_image(run, gpus, image, image_info, build_command, driver="") -> dict[str, str]:
    """Verdict of the CUDA probe in ``image``.

    run: the registered `docker run` result; image_info: the registered docker_image_info result for ``image``;
    build_command: what builds the image, told when it is missing; driver: the host's loaded driver version.
    """
    gpus = int(gpus)
    if gpus == 0:
        return dict(SKIP)
    image_info = image_info or {}
    if image_info.get("failed"):
        return _result(False, f"could not ask Docker for {image}: {_last_line(image_info.get('msg'))}")
    if not image_info.get("images"):
        return _result(False, f"image {image} is not on this host: build it with `{build_command}`")
    run = run or {}
    report = probe_report(run.get("stdout"))
    if report is None:
        why = _last_line(run.get("stderr")) or _last_line(run.get("msg")) or "no output"
        return _result(False, f"docker run --gpus all {image} failed (exit {run.get('rc', 'none')}): {why}")
    versions = (
        f"torch {report.get('torch') or 'none'}, CUDA {report.get('cuda') or 'none'}, driver {driver or 'unknown'}"
    )
    if report.get("error") or run.get("rc") != 0:
        error = report.get("error") or f"the probe exited {run.get('rc')}"
        return _result(False, f"{error} (in {image}; {versions})")
    devices = report.get("devices") or []
    names = ", ".join(f"cuda:{d.get('index')} {d.get('name')} (sm {d.get('capability')})" for d in devices)
    if len(devices) != gpus:
        return _result(
            False, f"the container computed on {len(devices)} of {gpus} GPUs: {names or 'none'} ({versions})"
        )
    return _result(True, f"{names}: allocated and multiplied on the GPU in {image}; {versions}")


class FilterModule:
    """GPU host decisions of the validator."""

    def filters(self):
        return {"dinops_driver_runs_images": dinops_driver_runs_images, "dinops_cuda_in_image": dinops_cuda_in_image}
