#!/usr/bin/env bash
# Make sure a Docker daemon answers: start the service, or dockerd itself where there is no systemd
# (containers, sandboxes, CI). Waits until `docker info` answers.
set -euo pipefail
docker info >/dev/null 2>&1 && exit 0
command -v dockerd >/dev/null || { echo "dockerd is missing: apt-get install -y docker.io" >&2; exit 2; }
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl start docker
else
  mkdir -p /var/log
  nohup dockerd >/var/log/dockerd.log 2>&1 &
fi
for _ in $(seq 1 60); do
  docker info >/dev/null 2>&1 && { echo "docker daemon is up"; exit 0; }
  sleep 1
done
echo "the docker daemon did not answer within 60 s; see /var/log/dockerd.log" >&2
exit 1
