# dinops-gpu-check: `dinops gpu-check`, run by the validator to prove that a container sees the GPU and computes
# on it (exit 0), or reports "no GPU" (exit 1). It adds only the dinops package to the shared PyTorch layer.
ARG TORCH_IMAGE=dinops-torch:latest
FROM ${TORCH_IMAGE} AS build
# Only this throw-away stage runs as root, to install into the root-owned /opt/venv; the final stage does not.
# hadolint ignore=DL3002
USER 0:0
COPY images/install-app.sh /usr/local/bin/install-app.sh
COPY pyproject.toml README.md constraints.txt /src/
COPY src /src/src
ARG WHEELHOUSE_URL=
RUN install-app.sh model

FROM ${TORCH_IMAGE}
COPY --from=build /stage/ /
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--", "dinops", "gpu-check"]
CMD []
ARG VERSION=0.0.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/dinops/dinops
LABEL org.opencontainers.image.title="dinops-gpu-check" \
      org.opencontainers.image.description="proves that a container sees a GPU and computes on it" \
      org.opencontainers.image.source="$SOURCE" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.licenses="Apache-2.0"
