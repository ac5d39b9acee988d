"""Bytes from a client -> an 8-bit RGB PIL image, upright, or an :class:`ApiError` that says what is wrong.

Only a few well-known formats are decoded (``Image.open(formats=...)``), dimensions are checked from the
header before any pixel is decoded (decompression bombs), EXIF orientation is applied, and every PIL mode is
mapped to RGB the way a person would expect: alpha composited on white, 16-bit samples scaled (not clipped).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from dinops.serve.errors import ApiError

FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF")


def decode(data: bytes, max_pixels: int) -> Image.Image:
    if not data:
        raise ApiError(400, "empty_image", "The request contained no image data.")
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError as exc:
        kinds = ", ".join(FORMATS)
        raise ApiError(415, "unsupported_image", f"The data is not an image in a supported format ({kinds}).") from exc
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise _too_large(max_pixels) from exc
    except Exception as exc:  # a decoder choking on a broken header: the client's data, not our failure
        raise ApiError(400, "corrupt_image", f"The image header could not be read: {exc}.") from exc
    width, height = image.size
    if width < 1 or height < 1:
        raise ApiError(400, "empty_image", f"The image has no pixels ({width}x{height}).")
    if width * height > max_pixels:
        raise _too_large(max_pixels, width, height)
    try:
        image.load()
        image = ImageOps.exif_transpose(image) or image
        return to_rgb(image)
    except Exception as exc:
        raise ApiError(
            400, "corrupt_image", f"The {image.format} image is truncated or corrupt and could not be decoded ({exc})."
        ) from exc


def _too_large(max_pixels: int, width: int | None = None, height: int | None = None) -> ApiError:
    size = f" ({width}x{height})" if width else ""
    return ApiError(
        413, "image_too_large", f"The image is too large{size}: at most {max_pixels:,} pixels are accepted."
    )


def to_rgb(image: Image.Image) -> Image.Image:
    mode = image.mode
    if mode == "RGB":
        return image
    if mode in {"I;16", "I;16B", "I;16L", "I;16N", "I"}:
        samples = np.asarray(image, dtype=np.int64)
        return Image.fromarray((np.clip(samples, 0, 65535) >> 8).astype(np.uint8)).convert("RGB")
    if mode == "F":
        samples = np.asarray(image, dtype=np.float64)
        scale = 255.0 if samples.size and samples.max() <= 1.0 else 1.0
        return Image.fromarray(np.clip(samples * scale, 0, 255).astype(np.uint8)).convert("RGB")
    if mode == "P" and "transparency" in image.info:
        image, mode = image.convert("RGBA"), "RGBA"
    if mode in {"RGBA", "LA", "PA", "RGBa", "La"}:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
