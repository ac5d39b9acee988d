from __future__ import annotations

import pytest

from dinops.data.synth import SynthSpec, generate


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory):
    """A small synthetic dataset in the COCO 2017 layout."""
    spec = SynthSpec(train_images=12, val_images=4, image_size=96, categories=4, seed=3)
    return generate(spec, tmp_path_factory.mktemp("synth"))
