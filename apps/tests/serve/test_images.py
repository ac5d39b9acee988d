"""Every PIL mode becomes the RGB a person expects."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from dinops.serve import images


def _roundtrip(image: Image.Image, fmt: str) -> Image.Image:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return images.decode(buffer.getvalue(), max_pixels=10**6)


@pytest.mark.parametrize(
    ("mode", "fmt"),
    [("L", "PNG"), ("LA", "PNG"), ("RGBA", "PNG"), ("P", "PNG"), ("P", "GIF"), ("1", "BMP"), ("CMYK", "JPEG"),
     ("I;16", "PNG"), ("RGB", "WEBP"), ("RGB", "TIFF"), ("I", "TIFF"), ("F", "TIFF")],
)  # fmt: skip
def test_every_mode_decodes_to_rgb(mode, fmt):
    decoded = _roundtrip(Image.new(mode, (30, 20)), fmt)
    assert decoded.mode == "RGB" and decoded.size == (30, 20)


def test_sixteen_bit_samples_are_scaled_not_clipped():
    samples = np.array([[0, 256, 32768, 65535]], dtype=np.uint16)
    decoded = _roundtrip(Image.fromarray(samples), "PNG")
    assert np.asarray(decoded)[0, :, 0].tolist() == [0, 1, 128, 255]


def test_transparency_becomes_white():
    image = Image.new("RGBA", (2, 1), (255, 0, 0, 255))
    image.putpixel((1, 0), (0, 0, 0, 0))
    assert np.asarray(_roundtrip(image, "PNG"))[0].tolist() == [[255, 0, 0], [255, 255, 255]]


def test_cmyk_converts_to_rgb_colours():
    decoded = _roundtrip(Image.new("CMYK", (8, 8), (0, 255, 255, 0)), "TIFF")
    assert np.asarray(decoded)[0, 0].tolist() == [255, 0, 0]
