# dinops-train: `dinops train|eval|synth|analyze`, and `torchrun` for several GPUs, on CPU or GPU. tini is PID 1
# and forwards `docker stop`'s SIGTERM so that training writes a checkpoint before it exits. Datasets and outputs
# live on volumes, never in the image.
ARG TORCH_IMAGE=dinops-torch:latest
FROM ${TORCH_IMAGE} AS build
# Only this throw-away stage runs as root, to install into the root-owned /opt/venv; the final stage does not.
# hadolint ignore=DL3002
USER 0:0
COPY images/install-app.sh /usr/local/bin/install-app.sh
COPY pyproject.toml README.md constraints.txt /src/
COPY src /src/src
ARG WHEELHOUSE_URL=
RUN install-app.sh train

FROM ${TORCH_IMAGE}
COPY --from=build /stage/ /
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["dinops", "train", "--help"]
ARG VERSION=0.0.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/dinops/dinops
LABEL org.opencontainers.image.title="dinops-train" \
      org.opencontainers.image.description="DINO training, evaluation, synthetic data and analysis" \
      org.opencontainers.image.source="$SOURCE" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.licenses="Apache-2.0"
