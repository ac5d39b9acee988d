"""`dinops gpu-check`: prove that this process sees a GPU and can compute on it with PyTorch.

For every visible CUDA device it reports the name, the compute capability, total and free memory, whether this
PyTorch build carries kernels for that capability, and the result of a float32 matrix multiply on the GPU
compared with the same product computed on the CPU. The validator runs it inside the `dinops-gpu-check` image
to show that the NVIDIA container toolkit hands the GPU to containers; on a workstation it answers the same
question for the local PyTorch.

Output: one human line per check, or one JSON object with ``--json``. Exit status (the validators' contract):

    0  a GPU is visible and every check passed
    1  a check failed; "no GPU" (PyTorch sees no CUDA device, e.g. on a CPU-only machine or a container
       started without a GPU) is such a failure, since proving a GPU is the command's purpose
    2  usage or environment error: bad arguments, PyTorch missing
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2
NO_GPU = "no GPU"


@dataclass
class Check:
    name: str
    status: str  # "pass" or "fail"
    detail: str


@dataclass
class Report:
    torch_version: str
    cuda_version: str | None
    driver: str | None
    devices: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.status == "pass" for c in self.checks)

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, "pass" if ok else "fail", detail))


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dinops gpu-check",
        description="Prove that this process sees a GPU and can compute on it with PyTorch.",
        epilog="Exit status: 0 all checks passed, 1 a check failed (including 'no GPU'), 2 usage or environment error.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of one line per check")
    parser.add_argument("--size", type=_matrix_size, default=2048, help="side of the square matrices (default 2048)")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1e-4,
        help="largest accepted error of the GPU product relative to the CPU one (default 1e-4)",
    )
    return parser


def _matrix_size(text: str) -> int:
    value = int(text)
    if not 16 <= value <= 16384:
        raise argparse.ArgumentTypeError(f"--size must be between 16 and 16384, got {value}")
    return value


def relative_error(result: Any, reference: Any) -> float:
    """Largest absolute difference scaled by the largest reference magnitude: 0.0 for identical tensors."""
    scale = float(reference.abs().max())
    return float((result.double() - reference.double()).abs().max()) / (scale if scale > 0 else 1.0)


def matmul_check(torch: Any, device: str, size: int, seed: int = 0) -> tuple[float, float]:
    """Multiply two seeded float32 matrices on ``device``; return (error relative to CPU float64, seconds)."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(size, size, generator=generator, dtype=torch.float32)
    b = torch.randn(size, size, generator=generator, dtype=torch.float32)
    reference = a.double() @ b.double()
    a_dev, b_dev = a.to(device), b.to(device)
    (a_dev @ b_dev).sum().item()  # warm-up: kernel selection and context creation stay out of the timing
    start = time.perf_counter()
    product = a_dev @ b_dev
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    return relative_error(product.cpu(), reference), seconds


def arch_supported(capability: tuple[int, int], arch_list: list[str]) -> tuple[bool, str]:
    """Whether a build compiled for ``arch_list`` (e.g. ['sm_80', 'sm_90', 'compute_90']) runs on ``capability``.

    Native code (sm_XY) must match the major version and not exceed the minor one; PTX (compute_XY) of an equal or
    lower capability is compiled by the driver at load time.
    """
    major, minor = capability
    sm = [tuple(divmod(int(a[3:]), 10)) for a in arch_list if a.startswith("sm_") and a[3:].isdigit()]
    ptx = [tuple(divmod(int(a[8:]), 10)) for a in arch_list if a.startswith("compute_") and a[8:].isdigit()]
    if any(m == major and n <= minor for m, n in sm):
        return True, f"native kernels for sm_{major}{minor}"
    if any((m, n) <= (major, minor) for m, n in ptx):
        return True, f"PTX JIT for sm_{major}{minor}"
    return False, f"this PyTorch build has no kernels for sm_{major}{minor} (built for {' '.join(arch_list) or 'none'})"


def _driver_version() -> str | None:
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            first = f.readline()
    except OSError:
        return None
    parts = first.split()
    return next((p for p in parts if p[:1].isdigit() and "." in p), first.strip() or None)


def run_checks(torch: Any, size: int, tolerance: float) -> Report:
    report = Report(torch_version=torch.__version__, cuda_version=torch.version.cuda, driver=_driver_version())
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        why = "this PyTorch has no CUDA support" if torch.version.cuda is None else "PyTorch sees no CUDA device"
        report.add("gpu visible", False, f"{NO_GPU}: {why}")
        return report
    report.add("gpu visible", True, f"{count} CUDA device(s), CUDA runtime {torch.version.cuda}")
    torch.backends.cuda.matmul.allow_tf32 = False  # compare full float32 against the CPU, not TF32
    arch_list = torch.cuda.get_arch_list()
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        info = {
            "index": index,
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "memory_total_mib": total // 2**20,
            "memory_free_mib": free // 2**20,
            "multiprocessors": props.multi_processor_count,
        }
        report.devices.append(info)
        label = f"cuda:{index} {props.name}"
        ok, why = arch_supported((props.major, props.minor), arch_list)
        report.add(f"{label} kernels", ok, why)
        if not ok:
            continue
        try:
            error, seconds = matmul_check(torch, f"cuda:{index}", size)
        except RuntimeError as exc:  # CUDA errors (no kernel image, out of memory, ECC) surface as RuntimeError
            report.add(f"{label} matmul", False, f"{type(exc).__name__}: {exc}")
            continue
        tflops = 2 * size**3 / seconds / 1e12
        info.update(matmul_relative_error=error, matmul_tflops=round(tflops, 2))
        report.add(
            f"{label} matmul",
            error <= tolerance,
            f"{size}x{size} float32, error vs CPU {error:.2e} (limit {tolerance:.0e}), {tflops:.1f} TFLOP/s",
        )
    return report


def format_human(report: Report) -> str:
    lines = [f"torch {report.torch_version}, CUDA {report.cuda_version or 'none'}, driver {report.driver or 'none'}"]
    for d in report.devices:
        lines.append(
            f"cuda:{d['index']} {d['name']}: compute capability {d['compute_capability']}, "
            f"{d['memory_total_mib']} MiB total, {d['memory_free_mib']} MiB free, {d['multiprocessors']} SMs"
        )
    lines += [f"{c.status.upper()}  {c.name}: {c.detail}" for c in report.checks]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    try:
        import torch
    except ImportError as exc:
        print(f"dinops gpu-check: PyTorch is not importable ({exc}); install dinops[model]", file=sys.stderr)
        return EXIT_ERROR
    report = run_checks(torch, args.size, args.tolerance)
    if args.json:
        print(json.dumps({**asdict(report), "passed": report.passed}, sort_keys=True))
    else:
        print(format_human(report))
    return EXIT_OK if report.passed else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
