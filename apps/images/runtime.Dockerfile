# dinops-runtime: what every dinops image shares, and nothing else: Python, tini as PID 1, the unprivileged user and
# an empty virtual environment (without pip: build stages bring their own). BASE_IMAGE selects the mode (see
# docs/images.md): the official slim Python image by default, or for air-gapped builds a Debian image made from the
# package archive by scripts/debian-image.sh, which already contains tini.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS trimmed

# tini's version is whatever the base's Debian release ships; the base image itself is the pin.
# Then what no dinops container runs goes: the package manager (apt, debconf and perl, purged through dpkg so that
# its database stays true for image scanners), glibc's iconv modules (Python has its own codecs), documentation,
# manual pages, translations and caches.
# hadolint ignore=DL3008,SC2046
RUN if ! command -v tini >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends tini; \
    fi \
 && groupadd --gid 10001 dinops \
 && useradd --uid 10001 --gid 10001 --home-dir /home/dinops --create-home --shell /usr/sbin/nologin dinops \
 && python3 -m venv --without-pip /opt/venv \
 && mkdir -p /usr/share/dinops \
 && rm -rf /usr/share/doc/* /usr/share/man/* /usr/share/info/* /usr/share/locale/* \
           /var/cache/* /var/lib/apt/lists/* /var/log/* /tmp/* /root/.cache /usr/lib/*-linux-gnu/gconv \
 && dpkg --purge --force-remove-essential --force-depends \
      $(dpkg-query -W -f '${Package}\n' apt gpgv debconf libapt-pkg6.0 libdebconfclient0 perl-base 2>/dev/null) \
 && rm -rf /var/cache/*

# One layer holding only what is left (files deleted in a later layer would still be shipped): copying the whole
# trimmed filesystem is the point here.
FROM scratch
# hadolint ignore=DL3067
COPY --from=trimmed / /
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VIRTUAL_ENV=/opt/venv \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/dinops
WORKDIR /home/dinops
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["python3", "--version"]
