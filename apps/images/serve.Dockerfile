# dinops-serve: the inference API (`dinops serve`, gunicorn) on CPU or GPU. The checkpoint is never inside the
# image: mount it and point DINO_CHECKPOINT at it.
ARG TORCH_IMAGE=dinops-torch:latest
FROM ${TORCH_IMAGE} AS build
# Only this throw-away stage runs as root, to install into the root-owned /opt/venv; the final stage does not.
# hadolint ignore=DL3002
USER 0:0
COPY images/install-app.sh /usr/local/bin/install-app.sh
COPY pyproject.toml README.md constraints.txt /src/
COPY src /src/src
ARG WHEELHOUSE_URL=
RUN install-app.sh serve

FROM ${TORCH_IMAGE}
COPY --from=build /stage/ /
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; port = os.environ.get('DINO_BIND', ':8000').rsplit(':', 1)[1]; urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4)"]
ENTRYPOINT ["/usr/bin/tini", "--", "dinops", "serve"]
CMD []
ARG VERSION=0.0.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/dinops/dinops
LABEL org.opencontainers.image.title="dinops-serve" \
      org.opencontainers.image.description="DINO object detection inference API" \
      org.opencontainers.image.source="$SOURCE" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.licenses="Apache-2.0"
