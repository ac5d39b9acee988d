"""The accuracy cost of bfloat16 inference on a CPU, against the official model's reference outputs.

Runs the official small reference model (../shared/dino/small: R50, 4 scales, two images, deterministic weights) on
the fast path in float32 and under bfloat16 autocast, and prints each one's distance from the official float32
outputs: logits and boxes (max abs), and of the 100 detections per image the official PostProcess keeps, how many
(query, label) pairs are the same and how far their scores are. A CPU without native bfloat16 (AVX-512 BF16 or AMX)
emulates it: the figures are then exact but slow (seconds for these two small images), and the speed is not
reported; ``bench_model.py`` measures the speed where the CPU has it.

    python apps/bench/bench_precision.py [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from official_dino import SHARED_DINO  # same directory: ../shared/dino or $DINOPS_SHARED_DIR/dino

from dinops.model import DINOConfig, build_dino, postprocess
from dinops.model.inference import cpu_bfloat16_supported, optimize_for_inference


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def _keys(labels: torch.Tensor, boxes: torch.Tensor) -> list[tuple[int, float]]:
    return list(zip(labels.tolist(), boxes[:, 0].round(decimals=1).tolist(), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    small = SHARED_DINO / "small"
    if not (small / "state_dict.pt").is_file():
        raise SystemExit(f"the official reference data is missing at {small} (set DINOPS_SHARED_DIR)")
    torch.set_num_threads(args.threads)
    config = DINOConfig.from_official(json.loads((small / "config.json").read_text()))
    inputs = torch.load(small / "inputs.pt", weights_only=True)
    reference = torch.load(small / "outputs.pt", weights_only=True)
    model = build_dino(config)
    model.load_state_dict(torch.load(small / "state_dict.pt", weights_only=True), strict=True)
    optimize_for_inference(model)
    native = cpu_bfloat16_supported()
    print(f"official small reference model, 2 images; this CPU's bfloat16: {'native' if native else 'emulated'}")
    print(f"{'precision':>9} {'logits':>9} {'boxes':>9} {'same top-100':>13} {'score err':>10} {'seconds':>8}")
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        start = time.perf_counter()
        with torch.inference_mode(), torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = model(inputs["padded"], inputs["mask"])
        seconds = time.perf_counter() - start
        out = {k: v.float() if torch.is_tensor(v) else v for k, v in out.items()}
        results = postprocess(out, inputs["orig_target_sizes"], num_select=reference["num_select"])
        same, errors = 0, []
        for i, got in enumerate(results):
            # A detection is (label, x0 of its box to 0.1 px): the same query's box with the same class.
            expected = dict(zip(_keys(reference[f"postprocess.{i}.labels"], reference[f"postprocess.{i}.boxes"]),
                                reference[f"postprocess.{i}.scores"].tolist(), strict=True))  # fmt: skip
            for key, score in zip(_keys(got["labels"], got["boxes"]), got["scores"].tolist(), strict=True):
                if key in expected:
                    same += 1
                    errors.append(abs(score - expected[key]))
        total = sum(len(reference[f"postprocess.{i}.labels"]) for i in range(len(results)))
        print(
            f"{name:>9} {_max_abs(out['pred_logits'], reference['pred_logits']):>9.2e} "
            f"{_max_abs(out['pred_boxes'], reference['pred_boxes']):>9.2e} {same:>6}/{total:<6} "
            f"{max(errors, default=float('nan')):>10.2e} {seconds if native or dtype is None else float('nan'):>8.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
