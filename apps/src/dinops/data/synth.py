"""`dinops synth`: a deterministic synthetic detection dataset in the COCO 2017 layout.

Coloured shapes of several categories and sizes on textured backgrounds, several objects per image, partly
occluding each other. The output folder looks like COCO 2017, so every command that reads COCO reads it::

    OUT/train2017/000000000001.jpg ...
    OUT/val2017/000000100001.jpg ...
    OUT/annotations/instances_train2017.json
    OUT/annotations/instances_val2017.json
    OUT/.dinops-complete.json                  written last: the dataset is complete

The same arguments always give byte-identical files: every image draws from its own random generator seeded
by (seed, split, index). The completion marker is the one `dinops download` writes (see
:mod:`dinops.download.marker`), with ``"source": "synthetic"`` and the ``spec``, so `dinops data-ready` (the
training Job's gate) passes after synth as after a download. Running synth again with the same arguments over a
complete dataset whose marker has the same spec does nothing and says so; another spec removes the marker first,
regenerates (removing images the new spec does not have) and writes the marker again. A folder whose marker says
it holds another (downloaded) dataset is refused.

Boxes are the full extent of each shape in COCO's ``[x, y, width, height]`` pixels; a shape is placed so that at
most ``--max-occlusion`` of its box is covered by shapes drawn after it.

Examples::

    dinops synth --out data/synth                                   # demo default
    dinops synth --out /tmp/s --train-images 64 --val-images 16 --image-size 96 --categories 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from dinops.download import marker

log = logging.getLogger(__name__)

# (name, RGB colour): shapes and colours both tell the categories apart.
CATEGORIES: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("circle", (220, 40, 40)),
    ("square", (40, 90, 230)),
    ("triangle", (40, 190, 60)),
    ("diamond", (240, 200, 30)),
    ("cross", (170, 60, 200)),
    ("ring", (30, 200, 210)),
    ("hexagon", (250, 130, 20)),
    ("bar", (240, 240, 240)),
)
SPLITS = {"train2017": 0, "val2017": 1}
VAL_ID_OFFSET = 100_000  # val image ids never collide with train ids


@dataclass(frozen=True)
class SynthSpec:
    """What to generate. Sizes are in pixels; object sizes are fractions of the image side."""

    train_images: int = 600
    val_images: int = 100
    image_size: int = 256
    categories: int = 6
    min_objects: int = 1
    max_objects: int = 5
    min_object_size: float = 0.15
    max_object_size: float = 0.45
    max_occlusion: float = 0.3
    texture: float = 1.0
    seed: int = 0

    def check(self) -> None:
        problems = []
        if not 1 <= self.categories <= len(CATEGORIES):
            problems.append(f"--categories must be between 1 and {len(CATEGORIES)}, got {self.categories}")
        if self.train_images < 1 or self.val_images < 1:
            problems.append("--train-images and --val-images must be at least 1")
        if self.image_size < 32:
            problems.append(f"--image-size must be at least 32, got {self.image_size}")
        if not 1 <= self.min_objects <= self.max_objects:
            problems.append("need 1 <= --min-objects <= --max-objects")
        if not 0.05 <= self.min_object_size <= self.max_object_size <= 0.9:
            problems.append("need 0.05 <= --min-object-size <= --max-object-size <= 0.9")
        if not 0.0 <= self.max_occlusion < 1.0:
            problems.append("--max-occlusion must be in [0, 1)")
        if problems:
            raise ValueError("; ".join(problems))


def _background(rng: np.random.Generator, size: int, texture: float) -> np.ndarray:
    """A smooth random colour field plus fine noise: texture without anything box-shaped."""
    base = rng.integers(60, 160, size=3).astype(np.float32)
    coarse = rng.normal(0.0, 25.0 * texture, size=(size // 16 + 2, size // 16 + 2, 3)).astype(np.float32)
    coarse = np.asarray(
        Image.fromarray(np.clip(coarse + 128, 0, 255).astype(np.uint8)).resize((size, size), Image.BICUBIC),
        dtype=np.float32,
    )
    fine = rng.normal(0.0, 8.0 * texture, size=(size, size, 3)).astype(np.float32)
    return np.clip(base + (coarse - 128) + fine, 0, 255).astype(np.uint8)


def _polygon(name: str, x0: float, y0: float, w: float, h: float) -> list[tuple[float, float]]:
    cx, cy = x0 + w / 2, y0 + h / 2
    if name == "triangle":
        return [(cx, y0), (x0 + w, y0 + h), (x0, y0 + h)]
    if name == "diamond":
        return [(cx, y0), (x0 + w, cy), (cx, y0 + h), (x0, cy)]
    if name == "hexagon":
        return [
            (x0 + w / 4, y0),
            (x0 + 3 * w / 4, y0),
            (x0 + w, cy),
            (x0 + 3 * w / 4, y0 + h),
            (x0 + w / 4, y0 + h),
            (x0, cy),
        ]
    raise ValueError(name)


def _draw(
    draw: ImageDraw.ImageDraw, name: str, colour: tuple[int, int, int], box: tuple[float, float, float, float]
) -> None:
    x0, y0, w, h = box
    x1, y1 = x0 + w - 1, y0 + h - 1
    if name == "circle":
        draw.ellipse((x0, y0, x1, y1), fill=colour)
    elif name == "square":
        draw.rectangle((x0, y0, x1, y1), fill=colour)
    elif name == "ring":
        draw.ellipse((x0, y0, x1, y1), outline=colour, width=max(2, int(min(w, h) / 5)))
    elif name == "cross":
        t = w / 3, h / 3
        draw.rectangle((x0 + t[0], y0, x1 - t[0], y1), fill=colour)
        draw.rectangle((x0, y0 + t[1], x1, y1 - t[1]), fill=colour)
    elif name == "bar":
        draw.rectangle((x0, y0, x1, y1), fill=colour, outline=(20, 20, 20), width=2)
    else:
        draw.polygon(_polygon(name, x0, y0, x1 - x0 + 1, y1 - y0 + 1), fill=colour)


def _covered_fraction(box: tuple[float, float, float, float], later: list[tuple[float, float, float, float]]) -> float:
    """Upper bound of the fraction of ``box`` covered by the boxes in ``later`` (sum of overlaps)."""
    x0, y0, w, h = box
    covered = 0.0
    for lx, ly, lw, lh in later:
        ix = max(0.0, min(x0 + w, lx + lw) - max(x0, lx))
        iy = max(0.0, min(y0 + h, ly + lh) - max(y0, ly))
        covered += ix * iy
    return covered / (w * h)


def _place_objects(rng: np.random.Generator, spec: SynthSpec) -> list[tuple[int, tuple[float, float, float, float]]]:
    """Pick (category index, box) pairs in drawing order, respecting the occlusion limit."""
    wanted = int(rng.integers(spec.min_objects, spec.max_objects + 1))
    placed: list[tuple[int, tuple[float, float, float, float]]] = []
    side = spec.image_size
    for _ in range(wanted * 20):
        if len(placed) == wanted:
            break
        category = int(rng.integers(0, spec.categories))
        w = float(np.round(rng.uniform(spec.min_object_size, spec.max_object_size) * side))
        aspect = 0.25 if CATEGORIES[category][0] == "bar" else rng.uniform(0.7, 1.4)
        h = float(np.clip(np.round(w * aspect), 8, side))
        x0 = float(rng.integers(0, side - int(w) + 1))
        y0 = float(rng.integers(0, side - int(h) + 1))
        box = (x0, y0, w, h)
        # every earlier shape must stay visible enough once this one is drawn over it
        if all(
            _covered_fraction(b, [other for _, other in placed[i + 1 :]] + [box]) <= spec.max_occlusion
            for i, (_, b) in enumerate(placed)
        ):
            placed.append((category, box))
    return placed


def render(spec: SynthSpec, split: str, index: int) -> tuple[Image.Image, list[dict]]:
    """One image and its annotations (without ids), determined by (spec.seed, split, index)."""
    rng = np.random.default_rng([spec.seed, SPLITS[split], index])
    image = Image.fromarray(_background(rng, spec.image_size, spec.texture))
    draw = ImageDraw.Draw(image)
    annotations = []
    for category, box in _place_objects(rng, spec):
        name, colour = CATEGORIES[category]
        jitter = rng.integers(-25, 26, size=3)
        _draw(draw, name, tuple(int(c) for c in np.clip(np.array(colour) + jitter, 0, 255)), box)
        annotations.append({"category_id": category + 1, "bbox": list(box), "area": box[2] * box[3], "iscrowd": 0})
    return image, annotations


def write_split(spec: SynthSpec, out: Path, split: str) -> Path:
    count = spec.train_images if split == "train2017" else spec.val_images
    image_dir = out / split
    image_dir.mkdir(parents=True, exist_ok=True)
    id_offset = VAL_ID_OFFSET if split == "val2017" else 0
    images, annotations = [], []
    for index in range(count):
        image_id = id_offset + index + 1
        file_name = f"{image_id:012d}.jpg"
        image, anns = render(spec, split, index)
        image.save(image_dir / file_name, quality=95)
        images.append({"id": image_id, "file_name": file_name, "width": spec.image_size, "height": spec.image_size})
        for ann in anns:
            annotations.append({"id": len(annotations) + 1 + id_offset, "image_id": image_id, **ann})
    categories = [
        {"id": i + 1, "name": name, "supercategory": "shape"}
        for i, (name, _) in enumerate(CATEGORIES[: spec.categories])
    ]
    document = {
        "info": {"description": "dinops synthetic shapes", "version": "1", "spec": spec.__dict__},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": categories,
    }
    ann_path = out / "annotations" / f"instances_{split}.json"
    ann_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = ann_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document))
    os.replace(tmp, ann_path)  # a half-written file never looks like an annotation file
    log.info("%s: %d images, %d objects -> %s", split, len(images), len(annotations), ann_path)
    return ann_path


class SynthError(ValueError):
    """The output folder cannot take this dataset; the message says why."""


def spec_fields(spec: SynthSpec) -> dict:
    """The spec as the marker stores it (JSON values)."""
    return json.loads(json.dumps(asdict(spec)))


def _files(root: Path, split: str) -> list[Path]:
    folder = root / split
    return sorted(folder.glob("*.jpg")) if folder.is_dir() else []


def is_complete(spec: SynthSpec, root: Path) -> bool:
    """True when ``root`` holds this spec's complete dataset: a synthetic marker with the same spec, both
    annotation files and the expected number of images. Raises :class:`SynthError` for another dataset's marker."""
    try:
        body = marker.read(root)
    except marker.MarkerError:
        return False
    if body is None:
        return False
    if body.get("source") != "synthetic":
        raise SynthError(
            f"{marker.path(root)} says {root} holds another dataset (source {body.get('source')!r}); "
            "synth would overwrite it: choose another --out"
        )
    counts = {"train2017": spec.train_images, "val2017": spec.val_images}
    return (
        body.get("spec") == spec_fields(spec)
        and all((root / "annotations" / f"instances_{split}.json").is_file() for split in SPLITS)
        and all(len(_files(root, split)) == counts[split] for split in SPLITS)
    )


def generate(spec: SynthSpec, out: str | os.PathLike) -> Path:
    """Write the dataset and, last, its completion marker; nothing when it is complete already (see above)."""
    spec.check()
    root = Path(out)
    if is_complete(spec, root):
        log.info("%s already holds this dataset (%s says complete, same spec): nothing to do", root, marker.MARKER)
        return root
    if marker.remove(root):
        log.info("removed the completion marker %s: this run changes the dataset", marker.path(root))
    files = 0
    for split in SPLITS:
        write_split(spec, root, split)
        count = spec.train_images if split == "train2017" else spec.val_images
        wanted = {f"{(VAL_ID_OFFSET if split == 'val2017' else 0) + i + 1:012d}.jpg" for i in range(count)}
        for stale in (p for p in _files(root, split) if p.name not in wanted):  # left by a larger earlier spec
            stale.unlink()
        files += count + 1
    target = marker.write(
        root,
        {"source": "synthetic", "synthetic": True, "spec": spec_fields(spec), "sets": list(SPLITS), "files": files},
    )
    log.info("the dataset is complete: wrote %s", target)
    return root


def get_args_parser() -> argparse.ArgumentParser:
    d = SynthSpec()
    p = argparse.ArgumentParser(
        prog="dinops synth", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", required=True, help="output folder (COCO 2017 layout)")
    p.add_argument("--train-images", type=int, default=d.train_images)
    p.add_argument("--val-images", type=int, default=d.val_images)
    p.add_argument("--image-size", type=int, default=d.image_size, help="side of the square images in pixels")
    p.add_argument("--categories", type=int, default=d.categories, help=f"1 to {len(CATEGORIES)}")
    p.add_argument("--min-objects", type=int, default=d.min_objects)
    p.add_argument("--max-objects", type=int, default=d.max_objects)
    p.add_argument("--min-object-size", type=float, default=d.min_object_size, help="fraction of the image side")
    p.add_argument("--max-object-size", type=float, default=d.max_object_size, help="fraction of the image side")
    p.add_argument("--max-occlusion", type=float, default=d.max_occlusion, help="largest covered fraction of a box")
    p.add_argument("--texture", type=float, default=d.texture, help="background texture strength (0 = flat)")
    p.add_argument("--seed", type=int, default=d.seed)
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spec = SynthSpec(**{k: v for k, v in vars(args).items() if k != "out"})
    try:
        generate(spec, args.out)
    except (ValueError, OSError) as exc:
        log.error("dinops synth: %s", exc)
        return 2
    return 0
