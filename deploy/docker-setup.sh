#!/usr/bin/env bash
# Prepares this machine to run the compose cluster: installs Docker and
# docker-compose (Debian packages), starts the engine if none runs, and
# builds the debian:bookworm base image with debootstrap, from the mirror
# and proxy this machine's apt is configured with, when no registry can
# provide it. Idempotent. Needs root (or sudo). Exits non-zero, saying why,
# when no engine can run here.
set -euo pipefail
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

missing=()
for p in docker.io docker-compose debootstrap; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! docker info > /dev/null 2>&1; then
  echo "docker-setup: starting dockerd"
  "${sudo_cmd[@]}" sh -c 'nohup dockerd > /var/log/segps-dockerd.log 2>&1 &'
  for _ in $(seq 1 60); do
    docker info > /dev/null 2>&1 && break
    sleep 1
  done
  if ! docker info > /dev/null 2>&1; then
    echo "docker-setup: dockerd did not start; its log:" >&2
    tail -20 /var/log/segps-dockerd.log >&2 || true
    exit 1
  fi
fi

if ! docker image inspect debian:bookworm > /dev/null 2>&1; then
  if timeout 120 docker pull debian:bookworm > /dev/null 2>&1; then
    echo "docker-setup: pulled debian:bookworm"
  else
    # The mirror (and proxy) this machine's apt uses: deploy/apt-source.sh.
    source "$(dirname "$0")/apt-source.sh"
    if ! source=$(apt_source bookworm); then
      echo "docker-setup: no registry, and no apt source to build debian:bookworm from" >&2
      exit 1
    fi
    read -r mirror suite <<< "$source"
    proxy=$(apt_proxy "${mirror%%:*}")
    echo "docker-setup: no registry; building debian:$suite with debootstrap from $mirror${proxy:+ through $proxy}"
    root=$(mktemp -d)
    "${sudo_cmd[@]}" env ${proxy:+http_proxy=$proxy https_proxy=$proxy} \
      debootstrap --variant=minbase "$suite" "$root" "$mirror" > /dev/null
    "${sudo_cmd[@]}" tar -C "$root" -c . | docker import - debian:bookworm > /dev/null
    "${sudo_cmd[@]}" rm -rf "$root"
  fi
fi
echo "docker-setup: engine $(docker version --format '{{.Server.Version}}'), base image ready"
