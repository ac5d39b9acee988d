"""Every PIL mode becomes the RGB a person expects, within the memory its header promised."""

from __future__ import annotations

import io
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from PIL import Image

from dinops.serve import images
from dinops.serve.errors import ApiError

LIMITS = images.Limits(max_pixels=10**6, max_bytes=2**30)
LIMITS_BIG = images.Limits(max_pixels=10**8, max_bytes=2**30)


def _roundtrip(image: Image.Image, fmt: str) -> Image.Image:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return images.decode(buffer.getvalue(), LIMITS)


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


def _encoded(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def test_sixteen_bit_conversion_allocates_no_wide_arrays():
    """uint16 >> 8, not int64: what Python and numpy allocate (traced by tracemalloc) stays under 8 bytes per pixel,
    the size of one int64 copy."""
    samples = np.random.default_rng(0).integers(0, 65536, (1500, 2000), dtype=np.uint16)
    data = _encoded(Image.fromarray(samples), "PNG")
    tracemalloc.start()
    try:
        decoded = images.decode(data, images.Limits(max_pixels=10**7, max_bytes=2**30, min_size=1500, max_size=2000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoded.size == (2000, 1500)
    assert np.array_equal(np.asarray(decoded)[:, :, 0], (samples >> 8).astype(np.uint8))
    assert peak < 8 * samples.size, f"{peak / samples.size:.1f} bytes per pixel"


def test_large_images_are_reduced_toward_the_model_size():
    pending = images.open_image(_encoded(Image.new("RGB", (4000, 3000)), "PNG"), LIMITS_BIG)
    assert (pending.width, pending.height, pending.factor) == (4000, 3000, 3)
    assert pending.decode().size == (1334, 1000)  # shorter side 1000 >= 800: nothing the model keeps is lost


def test_jpeg_is_decoded_at_a_dct_scale():
    pending = images.open_image(_encoded(Image.new("RGB", (8000, 6000)), "JPEG"), LIMITS_BIG)
    assert pending.image.size == (2000, 1500)  # 1/4: the largest scale still >= 1067x800
    assert pending.decode().size == (2000, 1500) and (pending.width, pending.height) == (8000, 6000)


def test_pixel_limit_counts_the_pixels_a_jpeg_really_decodes():
    limits = images.Limits(max_pixels=4_000_000, max_bytes=2**30)
    assert images.open_image(_encoded(Image.new("RGB", (8000, 6000)), "JPEG"), limits).image.size == (2000, 1500)
    with pytest.raises(ApiError) as refused:
        images.open_image(_encoded(Image.new("RGB", (2100, 2000)), "PNG"), limits)
    assert refused.value.status == 413 and "4,000,000 pixels" in refused.value.message
    assert "DINO_MAX_IMAGE_PIXELS" in refused.value.message


def test_memory_limit_counts_bits_and_channels_not_only_pixels():
    """Same pixels, different modes: 8-bit grey fits the limit, the same size as RGBA with a palette does not."""
    limits = images.Limits(max_pixels=10**8, max_bytes=64 * 2**20)
    grey = images.open_image(_encoded(Image.new("L", (4000, 4000)), "PNG"), limits)
    assert grey.cost <= limits.max_bytes
    with pytest.raises(ApiError) as refused:
        images.open_image(_encoded(Image.new("P", (4000, 4000)), "PNG", transparency=0), limits)
    assert refused.value.status == 413 and refused.value.code == "image_too_large"
    assert "at most 64 MiB per image" in refused.value.message and "DINO_MAX_IMAGE_MB" in refused.value.message


STORAGE = {"1": 1, "L": 1, "I;16": 2, "I": 4, "F": 4, "LA": 4, "RGB": 4, "RGBA": 4}


def test_storage_bytes_match_pillow():
    """The bytes per pixel the estimate uses are what Pillow allocates (RSS of fresh 2000x2000 images, one process)."""
    script = (
        "import sys\n"
        "from PIL import Image\n"
        "def rss(): return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])\n"
        "kept = []  # all stay alive: memory freed by one would be reused by the next\n"
        "for mode in sys.argv[1:]:\n"
        "    before = rss(); kept.append(Image.new(mode, (2000, 2000))); print((rss() - before) * 1024 / 4e6)\n"
    )
    run = subprocess.run([sys.executable, "-c", script, *STORAGE], capture_output=True, text=True, check=True)
    measured = dict(zip(STORAGE, map(float, run.stdout.split()), strict=True))
    for mode, expected in STORAGE.items():
        assert images.storage_bytes(mode) == expected
        assert measured[mode] == pytest.approx(expected, rel=0.1), mode


MEMORY_CASES = [
    ("PNG", "I;16", (6000, 6000)), ("PNG", "I;16", (2000, 1500)), ("PNG", "RGB", (6000, 4000)),
    ("PNG", "RGBA", (5000, 4000)), ("PNG", "P", (5000, 4000)), ("PNG", "LA", (2600, 1500)),
    ("TIFF", "I", (5000, 4000)), ("TIFF", "F", (5000, 4000)), ("BMP", "1", (5000, 4000)),
    ("JPEG", "RGB", (8000, 6000)), ("JPEG", "CMYK", (6000, 4000)), ("WEBP", "RGBA", (5000, 4000)),
    ("GIF", "P", (5000, 4000)),
]  # fmt: skip

_MEASURE = """
import io, sys
import numpy as np
from PIL import Image
from dinops.serve import images
from dinops.serve.errors import ApiError
fmt, mode, width, height = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def status(key): return int(next(l for l in open('/proc/self/status') if l.startswith(key)).split()[1]) * 1024
if mode == 'I;16':  # noise when small; zeros when large (an attacker's 70 kB), as noise takes long to compress
    noise = np.random.default_rng(0).integers(0, 65536, (height, width), dtype=np.uint16)
    image = Image.fromarray(noise if width * height <= 4_000_000 else np.zeros_like(noise))
else:
    image = Image.new(mode, (width, height))
buffer = io.BytesIO()
image.save(buffer, fmt, **({'transparency': 0} if mode == 'P' else {}))
data = buffer.getvalue()
del image, buffer
pending = images.open_image(data, images.Limits(max_pixels=10**9, max_bytes=2**40))
with open('/proc/self/clear_refs', 'w') as clear:
    clear.write('5')  # resets VmHWM, the peak RSS (proc(5), /proc/pid/clear_refs)
before = status('VmRSS')
pixels = np.array(pending.decode(), dtype=np.uint8)
print(pending.cost, status('VmHWM') - before)
"""


@pytest.mark.parametrize(
    ("fmt", "mode", "size"), MEMORY_CASES, ids=[f"{f}-{m}-{w}x{h}" for f, m, (w, h) in MEMORY_CASES]
)
def test_decoding_stays_within_the_estimate(fmt, mode, size):
    """The header's estimate bounds the peak RSS that decoding, conversion and the model's array really add
    (measured in a fresh process each: freed memory of earlier cases would hide growth)."""
    run = subprocess.run([sys.executable, "-c", _MEASURE, fmt, mode, *map(str, size)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    cost, peak = map(int, run.stdout.split())
    assert peak <= cost, f"peak {peak / 2**20:.0f} MiB > estimate {cost / 2**20:.0f} MiB"
    assert cost <= 3 * peak + 16 * 2**20, f"estimate {cost / 2**20:.0f} MiB, far above the peak {peak / 2**20:.0f} MiB"
