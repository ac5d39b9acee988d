# Runs inside the serve (or train) image, started by the validator with `docker run --gpus all ... python3 -c`:
# proves that the image's PyTorch reaches every GPU the container was given by allocating a tensor on each and
# multiplying it there. Prints one JSON line the validator reads (tests/ansible/test_validate_gpu_section.py runs it
# on CPU):
#   {"torch": "2.9.0+cu130", "cuda": "13.0", "cuda_available": true, "error": null,
#    "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_gib": 79.2}]}
# Exit status: 0 every visible GPU computed the right product; 1 a CUDA error or a wrong product; 2 PyTorch is not
# importable; 3 CUDA is unavailable (no device visible, a CPU-only PyTorch, or a driver too old for its runtime).
import json
import sys
import warnings

EXIT_OK, EXIT_CUDA_ERROR, EXIT_NO_TORCH, EXIT_NO_CUDA = 0, 1, 2, 3
SIZE = 1024  # ones(SIZE, SIZE) squared is SIZE everywhere, exactly, in float32 and TF32 alike


def probe(torch):
    """(the JSON report, the exit status) for this process's view of CUDA."""
    report = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": False, "devices": []}
    # torch reports an unusable driver ("too old", "no NVIDIA driver") as a warning and answers False.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    if not available:
        if torch.version.cuda is None:
            why = "this PyTorch is built without CUDA"
        else:
            why = "; ".join(str(w.message).strip() for w in caught) or "no CUDA device visible"
        report["error"] = f"torch.cuda.is_available() is False: {why}"
        return report, EXIT_NO_CUDA
    report["cuda_available"] = True
    try:
        for index in range(torch.cuda.device_count()):
            device = torch.device("cuda", index)
            props = torch.cuda.get_device_properties(device)
            ones = torch.ones((SIZE, SIZE), device=device)
            product = ones @ ones
            torch.cuda.synchronize(device)
            if not bool((product == SIZE).all()):
                report["error"] = f"cuda:{index} {props.name}: ones @ ones is not {SIZE} everywhere"
                return report, EXIT_CUDA_ERROR
            report["devices"].append(
                {
                    "index": index,
                    "name": props.name,
                    "capability": f"{props.major}.{props.minor}",
                    "memory_gib": round(props.total_memory / 2**30, 1),
                }
            )
    except RuntimeError as exc:  # CUDA errors (no kernel image for this GPU, out of memory, ECC) surface as this
        first_line = (str(exc).strip().splitlines() or [""])[0]
        report["error"] = f"{type(exc).__name__}: {first_line}"
        return report, EXIT_CUDA_ERROR
    report["error"] = None
    return report, EXIT_OK


def main():
    try:
        import torch
    except ImportError as exc:
        report = {"torch": None, "cuda": None, "cuda_available": False, "devices": []}
        print(json.dumps({**report, "error": f"PyTorch is not importable: {exc}"}, sort_keys=True))
        return EXIT_NO_TORCH
    report, status = probe(torch)
    print(json.dumps(report, sort_keys=True))
    return status


if __name__ == "__main__":
    sys.exit(main())
