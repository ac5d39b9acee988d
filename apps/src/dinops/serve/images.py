"""Bytes from a client -> an 8-bit RGB PIL image, upright and no larger than the model needs, or an
:class:`ApiError` that says what is wrong and which limit it broke.

Decoding happens in two steps so that memory is bounded before any pixel is decoded:

1. :func:`open_image` reads the header only (``Image.open`` is lazy: size, mode and bits per sample, no pixels).
   JPEG is asked for a DCT-scaled decode (``Image.draft``: the decoder returns the image at 1/2, 1/4 or 1/8 scale,
   never smaller than the requested size; Pillow's reference, ``Image.draft``). From the size that will really be
   decoded and the mode's storage it computes :attr:`Pending.cost`, the bytes every image of the conversion takes
   (summed: an upper bound, as some are freed before the next exists), and refuses the image when the decoded
   pixels exceed DINO_MAX_IMAGE_PIXELS or the cost exceeds DINO_MAX_IMAGE_MB.
2. :meth:`Pending.decode` decodes, reduces the image by a whole factor (``Image.reduce``, a box average) toward the
   size the model resizes to (the shorter side to ``min_size``, the longer at most ``max_size``, as evaluation),
   then applies EXIF orientation and maps every PIL mode to RGB the way a person would expect: alpha composited on
   white, 16-bit samples scaled (``>> 8`` in 16 or 32-bit integers, never a 64-bit array), not clipped.

Detections are still reported in the pixels of the upright original (:attr:`Pending.width`, :attr:`Pending.height`):
the reduction only drops pixels the model's own resize would have averaged away.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageMode, UnidentifiedImageError

from dinops.serve.errors import ApiError

FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF")
MIB = 2**20

# EXIF tag 0x0112 (Orientation), values 2-8 -> the transposition that makes the image upright (EXIF 2.32, 4.6.4 A;
# the same table as Pillow's ImageOps.exif_transpose).
ORIENTATION = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
SIXTEEN_BIT = {"I;16", "I;16B", "I;16L", "I;16N"}
ALPHA = {"RGBA", "LA", "PA", "RGBa", "La"}
# Modes Image.reduce cannot average, and the mode each is first converted to (at full size) so that it can. 16-bit
# images are averaged by Image.resize's box filter instead, which keeps their two bytes per sample.
UNREDUCIBLE = {"1": "L", "P": "RGBA"}


@dataclass(frozen=True)
class Limits:
    """What one image may cost (DINO_MAX_IMAGE_PIXELS, DINO_MAX_IMAGE_MB) and the model's resize (DINO_MIN_SIZE,
    DINO_MAX_SIZE), toward which images are reduced early."""

    max_pixels: int
    max_bytes: int
    min_size: int = 800
    max_size: int = 1333


def storage_bytes(mode: str) -> int:
    """Bytes per pixel of a decoded PIL image of ``mode``: one band is stored in its sample size (1 bit and 8 bits in
    one byte, 16-bit in two, 32-bit int or float in four); two to four bands of 8 bits take four bytes per pixel
    (Pillow's libImaging/Storage.c stores them as 32-bit pixels; measured in tests/serve/test_images.py)."""
    try:
        descriptor = ImageMode.getmode(mode)
    except KeyError:  # a mode Pillow has no descriptor for: count it as the widest storage
        return 4
    if len(descriptor.bands) > 1:
        return 4
    return max(1, int(descriptor.typestr[-1]))


def _conversion_bytes(mode: str) -> int:
    """Bytes per pixel that the conversion of an already reduced image of ``mode`` to RGB allocates, up to the
    ``np.array`` of :meth:`Detector.prepare`. ``np.asarray`` of a PIL image goes through ``Image.tobytes``, which
    joins a list of encoded chunks: twice the samples' bytes for a moment."""
    final = 3 * 3 + 4  # prepare's array (chunks, joined bytes, the array) and an EXIF transposition
    if mode == "RGB":
        return final
    if mode in SIXTEEN_BIT:  # samples (x2), shifted, uint8, L, RGB
        return 2 * 2 + 2 + 1 + 1 + 4 + final
    if mode in {"I", "F"}:  # 32-bit samples (x2), clipped (and scaled), uint8, L, RGB
        return 4 * 2 + 4 * 2 + 1 + 1 + 4 + final
    if mode in ALPHA or mode == "P":  # RGBA, a white RGBA background, the composite, RGB
        return 4 * 4 + final
    return 4 + final


@dataclass
class Pending:
    """An opened image whose header passed the limits; nothing decoded yet. ``width`` and ``height`` are the
    original's, upright once :meth:`decode` has read the EXIF orientation: detections are reported in these pixels."""

    image: Image.Image | None
    width: int
    height: int
    factor: int  # Image.reduce factor applied after decoding (1: none)
    cost: int  # bytes the decode and the conversion may allocate, summed
    held: int  # bytes of the final RGB array handed to the model

    def decode(self) -> Image.Image:
        """The RGB image, upright and reduced; a broken file body is a 400 ``corrupt_image``. Once only: the
        full-size decoded image is dropped as soon as it is reduced."""
        image, self.image = self.image, None
        if image is None:
            raise RuntimeError("Pending.decode called twice")
        kind = image.format
        try:
            image.load()
            orientation = _orientation(image)  # after load: a PNG's eXIf chunk may follow its pixels
            image = _reduce(image, self.factor)
            if orientation in ORIENTATION:
                image = image.transpose(ORIENTATION[orientation])
            if orientation in {5, 6, 7, 8}:
                self.width, self.height = self.height, self.width
            return to_rgb(image)
        except Exception as exc:
            raise ApiError(
                400, "corrupt_image", f"The {kind} image is truncated or corrupt and could not be decoded ({exc})."
            ) from exc


def open_image(data: bytes, limits: Limits) -> Pending:
    """Read the header, plan the decode and check it against ``limits``; decodes nothing."""
    if not data:
        raise ApiError(400, "empty_image", "The request contained no image data.")
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError as exc:
        kinds = ", ".join(FORMATS)
        raise ApiError(415, "unsupported_image", f"The data is not an image in a supported format ({kinds}).") from exc
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ApiError(
            413,
            "image_too_large",
            f"The image is too large: at most {limits.max_pixels:,} pixels are decoded (DINO_MAX_IMAGE_PIXELS).",
        ) from exc
    except Exception as exc:  # a decoder choking on a broken header: the client's data, not our failure
        raise ApiError(400, "corrupt_image", f"The image header could not be read: {exc}.") from exc
    width, height = image.size
    if width < 1 or height < 1:
        raise ApiError(400, "empty_image", f"The image has no pixels ({width}x{height}).")
    needed = _needed_size(image.size, limits)
    if image.format == "JPEG" and needed != image.size:
        image.draft(None, needed)  # DCT scaling: decodes at 1/2, 1/4 or 1/8 of the size, never below `needed`
    loaded = image.size  # what the decoder will produce
    pixels = loaded[0] * loaded[1]
    if pixels > limits.max_pixels:
        scaled = f", {loaded[0]}x{loaded[1]} after JPEG scaling" if loaded != (width, height) else ""
        raise ApiError(
            413,
            "image_too_large",
            f"The image is too large ({width}x{height}{scaled}): at most {limits.max_pixels:,} pixels are decoded "
            "(DINO_MAX_IMAGE_PIXELS).",
        )
    factor = max(1, min(loaded[0] // needed[0], loaded[1] // needed[1]))
    reduced = math.ceil(loaded[0] / factor) * math.ceil(loaded[1] / factor)
    cost, converted = pixels * storage_bytes(image.mode), image.mode  # the decoded image
    if image.format == "WEBP":  # libwebp's output buffer and its copy as bytes come before Pillow's image (measured)
        cost *= 3
    if factor > 1:
        converted = UNREDUCIBLE.get(image.mode, image.mode)
        if converted == "RGBA" and "transparency" not in image.info:  # as _reduce does
            converted = "RGB"
        if converted != image.mode:  # converted at full size before it can be reduced
            cost += pixels * storage_bytes(converted)
        if converted in {"RGBA", "LA"}:  # Image.reduce averages them premultiplied: one more full-size copy
            cost += pixels * 4
        cost += reduced * storage_bytes(converted)
    cost += reduced * _conversion_bytes(converted)
    if cost > limits.max_bytes:
        raise ApiError(
            413,
            "image_too_large",
            f"Decoding the image ({width}x{height}, {image.mode}) would take about {cost / MIB:,.0f} MiB: at most "
            f"{limits.max_bytes / MIB:,.4g} MiB per image are accepted (DINO_MAX_IMAGE_MB).",
        )
    return Pending(image, width, height, factor=factor, cost=cost, held=reduced * 3)


def decode(data: bytes, limits: Limits) -> Image.Image:
    """:func:`open_image` then :meth:`Pending.decode`."""
    return open_image(data, limits).decode()


def _needed_size(size: tuple[int, int], limits: Limits) -> tuple[int, int]:
    """The smallest size that still holds every pixel the model's resize keeps (the image's size if it is upscaled)."""
    short, long = sorted(size)
    scale = min(limits.min_size / short, limits.max_size / long)
    if scale >= 1:
        return size
    return (max(1, math.ceil(size[0] * scale)), max(1, math.ceil(size[1] * scale)))


def _orientation(image: Image.Image) -> int:
    try:
        return int(image.getexif().get(0x0112, 1))
    except Exception:  # an unreadable EXIF block is no reason to refuse the pixels
        return 1


def _reduce(image: Image.Image, factor: int) -> Image.Image:
    if factor <= 1:
        return image
    if image.mode in SIXTEEN_BIT:
        size = (math.ceil(image.width / factor), math.ceil(image.height / factor))
        return image.resize(size, Image.Resampling.BOX)
    mode = UNREDUCIBLE.get(image.mode)
    if mode == "RGBA" and "transparency" not in image.info:
        mode = "RGB"
    if mode is not None:
        image = image.convert(mode)
    return image.reduce(factor)


def to_rgb(image: Image.Image) -> Image.Image:
    mode = image.mode
    if mode == "RGB":
        return image
    if mode in SIXTEEN_BIT:  # uint16 >> 8: the high byte, as 16 bits -> 8 bits should scale
        samples = np.asarray(image)
        return Image.fromarray((samples >> 8).astype(np.uint8)).convert("RGB")
    if mode == "I":  # 32-bit ints (16-bit TIFFs, a reduced 16-bit PNG): clipped to 16 bits in int32, then >> 8
        samples = np.clip(np.asarray(image), 0, 65535)
        np.right_shift(samples, 8, out=samples)
        return Image.fromarray(samples.astype(np.uint8)).convert("RGB")
    if mode == "F":  # float32 throughout: [0, 1] is scaled to [0, 255], anything else clipped to it
        samples = np.asarray(image, dtype=np.float32)
        scale = np.float32(255.0 if samples.size and samples.max() <= 1.0 else 1.0)
        return Image.fromarray(np.clip(samples * scale, 0, 255).astype(np.uint8)).convert("RGB")
    if mode == "P" and "transparency" in image.info:
        image, mode = image.convert("RGBA"), "RGBA"
    if mode in ALPHA:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
