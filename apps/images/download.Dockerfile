# dinops-download: `dinops download`, the resumable and verified dataset downloader (HTTP and S3) that fills a
# volume. No PyTorch in it.
ARG RUNTIME_IMAGE=dinops-runtime:latest
FROM ${RUNTIME_IMAGE} AS build
# Only this throw-away stage runs as root, to install into the root-owned /opt/venv; the final stage does not.
# hadolint ignore=DL3002
USER 0:0
COPY images/install-app.sh /usr/local/bin/install-app.sh
COPY pyproject.toml README.md constraints.txt /src/
COPY src /src/src
ARG WHEELHOUSE_URL=
RUN install-app.sh download

FROM ${RUNTIME_IMAGE}
COPY --from=build /stage/ /
# /data belongs to the app's user, so that a new named volume mounted there is writable (Docker copies the
# mount point's ownership into an empty volume).
USER 0:0
RUN mkdir -p /data && chown 10001:10001 /data
USER 10001:10001
ENV DOWNLOAD_DEST=/data/coco
ENTRYPOINT ["/usr/bin/tini", "--", "dinops", "download"]
CMD ["--help"]
ARG VERSION=0.0.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/dinops/dinops
LABEL org.opencontainers.image.title="dinops-download" \
      org.opencontainers.image.description="resumable, verified dataset downloader (HTTP and S3)" \
      org.opencontainers.image.source="$SOURCE" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.licenses="Apache-2.0"
