# dinops-prometheus: Debian's Prometheus server and promtool on dinops-runtime (tini as PID 1, python3 for the health
# check and the validator's probes, user 10001, no package manager). It scrapes the trainer, the inference API and
# DCGM's exporter with the configuration that deployments mount at /etc/prometheus
# (k8s/components/monitoring/prometheus/); the time series live on the volume mounted at /prometheus.
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG RUNTIME_IMAGE=dinops-runtime:latest

# apt is gone from dinops-runtime, so the package is installed in a throw-away stage on the runtime's own base, whose
# Debian release decides the version, as for tini in runtime.Dockerfile: the base image is the pin. With the
# air-gapped base (Debian bookworm) that is prometheus 2.42.0+ds-5+deb12u1
# (https://packages.debian.org/bookworm/prometheus), and the pull-mode base python:3.11-slim-bookworm is the same
# release (plain python:3.11-slim moved to trixie in August 2025); a package laid out otherwise fails the checks
# below. Only the build stage sees apt.
FROM ${BASE_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Checked here, not assumed:
# - both Go binaries link only glibc (ldd), which dinops-runtime has, so they are copied alone;
# - Debian's build serves the classic web UI from files, not from assets compiled in: `prometheus --help` defaults
#   --web.local-assets to /usr/share/prometheus/web/, whose static/ links into /usr/share/javascript, /usr/share/nodejs
#   and /usr/share/fonts-glyphicons (the libjs-* and fonts-* dependencies; `dpkg -L prometheus`). The tree is copied
#   with its links resolved, except moment-timezone's raw zone data (over 200 MB): the UI's pages load only
#   moment-timezone-with-data.min.js (web/templates/_base.html, graph.html).
# - The console templates (--web.console.templates=/etc/prometheus/consoles) are examples only in Debian's package;
#   none is copied, and /consoles/ answers 404.
# The Debian packages the stage installed are recorded in /usr/share/dinops/debian-packages.txt (the image's dpkg
# database does not list them). The default configuration only lets the image start alone (it scrapes itself):
# deployments mount their own over /etc/prometheus. /prometheus belongs to 10001 by number: COPY --from keeps the
# owner, and a new named volume mounted there takes the mount point's owner.
# hadolint ignore=DL3008
RUN dpkg-query -W -f '${Package} ${Version}\n' | sort >/tmp/packages-before \
 && apt-get update \
 && apt-get install -y --no-install-recommends prometheus \
 && for tool in prometheus promtool; do \
      others=$(ldd "/usr/bin/$tool" | grep -vE 'linux-vdso\.so|libc\.so\.6|ld-linux' || true); \
      if [ -n "$others" ]; then echo "/usr/bin/$tool links more than glibc: $others" >&2; exit 1; fi; \
    done \
 && mkdir -p /stage/usr/bin /stage/usr/share/prometheus /stage/usr/share/dinops /stage/etc/prometheus \
      /stage/prometheus \
 && cp /usr/bin/prometheus /usr/bin/promtool /stage/usr/bin/ \
 && cp -R -L /usr/share/prometheus/web /stage/usr/share/prometheus/web \
 && rm -rf /stage/usr/share/prometheus/web/static/moment-timezone/data \
 && test -s /stage/usr/share/prometheus/web/static/moment-timezone/moment-timezone-with-data.min.js \
 && dpkg-query -W -f '${Package} ${Version}\n' | sort | comm -13 /tmp/packages-before - \
      >/stage/usr/share/dinops/debian-packages.txt \
 && grep -q '^prometheus ' /stage/usr/share/dinops/debian-packages.txt \
 && printf '%s\n' 'global:' '  scrape_interval: 15s' 'scrape_configs:' '  - job_name: prometheus' \
      '    static_configs:' '      - targets: [127.0.0.1:9090]' >/stage/etc/prometheus/prometheus.yml \
 && chown 10001:10001 /stage/prometheus \
 && /stage/usr/bin/promtool check config /stage/etc/prometheus/prometheus.yml

FROM ${RUNTIME_IMAGE}
COPY --from=build /stage/ /
USER 10001:10001
EXPOSE 9090
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9090/-/healthy', timeout=4)"]
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus", "--web.listen-address=:9090"]
ARG VERSION=0.0.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/dinops/dinops
LABEL org.opencontainers.image.title="dinops-prometheus" \
      org.opencontainers.image.description="Prometheus (Debian's package) scraping dinops training, serving and GPUs" \
      org.opencontainers.image.source="$SOURCE" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.licenses="Apache-2.0"
