# dinops-torch: dinops-runtime plus PyTorch with its CUDA runtime wheels: the one multi-GB layer that serve, train
# and gpu-check share. No CUDA toolkit and no GPU are needed to build it; the NVIDIA container toolkit supplies the
# driver at run time, and the same image runs on CPU.
ARG RUNTIME_IMAGE=dinops-runtime:latest
FROM ${RUNTIME_IMAGE}

USER 0:0
COPY constraints.txt /usr/share/dinops/constraints.txt
# Set for air-gapped builds: a --find-links URL serving the wheelhouse (apps/images/build.py serves it).
ARG WHEELHOUSE_URL=
# The packages of the `model` extra in apps/pyproject.toml; versions are pinned by the constraints file.
# The runtime's venv has no pip: the one bundled with Python is added first, and stays (serve, train and gpu-check
# install on top of this image).
# hadolint ignore=DL3013
RUN python3 -m venv /opt/venv \
 && set -- \
 && if [ -n "$WHEELHOUSE_URL" ]; then set -- --no-index --find-links "$WHEELHOUSE_URL"; fi \
 && HOME=/root pip install --no-cache-dir "$@" --constraint /usr/share/dinops/constraints.txt torch torchvision pillow \
 && pip freeze --all >/usr/share/dinops/installed.txt
USER 10001:10001
