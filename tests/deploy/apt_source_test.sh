#!/usr/bin/env bash
# deploy/apt-source.sh on sample apt configurations (no network): the mirror
# debootstrap gets comes from the machine's sources in either format, and
# apt's proxy goes with it.
set -uo pipefail
source "$(dirname "$0")/../../deploy/apt-source.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
expect() {  # expect NAME WANTED ACTUAL
  if [ "$2" != "$3" ]; then
    echo "FAIL $1: expected [$2], got [$3]"
    failures=$((failures + 1))
  else
    echo "ok   $1"
  fi
}

# deb822: a disabled stanza, a source-only one, a key block spread over
# continuation lines, and a stanza whose first URI debootstrap cannot fetch.
mkdir -p "$tmp/a/sources.list.d"
cat > "$tmp/a/sources.list.d/debian.sources" <<'SRC'
# the machine's mirror
Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb-src
URIs: http://source-only.example/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://updates.example/debian
Suites: bookworm-updates
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBGPL0BUBEADmW5NdOOHwPIJlgPu6JDcKw/NZJPR8lsD3K87ZM18gzyQZJD+w
 -----END PGP PUBLIC KEY BLOCK-----

Types: deb deb-src
URIs: mirror+file:/etc/apt/mirrors.txt
  http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: contrib main
SRC
expect "deb822 picks the enabled binary source with the suite and main" \
  "http://mirror.example/debian bookworm" "$(apt_source bookworm "$tmp/a" 2> /dev/null)"
expect "deb822 finds another suite" "http://updates.example/debian bookworm-updates" \
  "$(apt_source bookworm-updates "$tmp/a" 2> /dev/null)"

# One-line format: sources.list first, options in brackets, comments,
# deb-src lines and entries for other suites or without main.
mkdir -p "$tmp/b/sources.list.d"
cat > "$tmp/b/sources.list" <<'SRC'
# deb http://commented.example/debian bookworm main
deb-src http://source-only.example/debian bookworm main
deb http://security.example/debian-security bookworm-security main
deb http://nonfree.example/debian bookworm non-free
   deb [ arch=amd64 signed-by=/usr/share/keyrings/k.gpg ] https://proxy-mirror.example/debian bookworm contrib main # the mirror
SRC
cat > "$tmp/b/sources.list.d/later.sources" <<'SRC'
Types: deb
URIs: http://later.example/debian
Suites: bookworm
Components: main
SRC
expect "one-line format, sources.list before sources.list.d" \
  "https://proxy-mirror.example/debian bookworm" "$(apt_source bookworm "$tmp/b" 2> /dev/null)"
rm "$tmp/b/sources.list"
expect "sources.list.d/*.sources without sources.list" "http://later.example/debian bookworm" \
  "$(apt_source bookworm "$tmp/b" 2> /dev/null)"

# Nothing usable: no output, status 1, and a message naming what was read.
error=$(apt_source trixie "$tmp/a" 2>&1 > /dev/null)
status=$?
expect "no source for the suite fails" "1" "$status"
case "$error" in
  *"suite trixie"*"$tmp/a/sources.list.d/debian.sources"*"http://mirror.example/debian"*) echo "ok   the error names the suite, the file and what it offers" ;;
  *) echo "FAIL the error names the suite, the file and what it offers: [$error]"; failures=$((failures + 1)) ;;
esac
mkdir -p "$tmp/empty"
error=$(apt_source bookworm "$tmp/empty" 2>&1 > /dev/null)
expect "no sources at all fails" "1" "$?"
case "$error" in
  *"$tmp/empty"*) echo "ok   the error names where it looked" ;;
  *) echo "FAIL the error names where it looked: [$error]"; failures=$((failures + 1)) ;;
esac

# apt's proxy, as apt-config reads it from the file APT_CONFIG names.
if command -v apt-config > /dev/null; then
  echo 'Acquire::http::Proxy "http://proxy.example:3128";' > "$tmp/proxy.conf"
  expect "apt's http proxy" "http://proxy.example:3128" "$(APT_CONFIG=$tmp/proxy.conf apt_proxy http)"
  echo 'Acquire::http::Proxy "DIRECT";' > "$tmp/direct.conf"
  expect "DIRECT is no proxy" "" "$(APT_CONFIG=$tmp/direct.conf apt_proxy http)"
fi

# The script that builds the image carries no mirror of its own.
if grep -nE '(https?|ftp)://' "$(dirname "$0")/../../deploy/docker-setup.sh"; then
  echo "FAIL deploy/docker-setup.sh names a mirror"
  failures=$((failures + 1))
fi
[ "$failures" -eq 0 ] && echo "all passed" || { echo "$failures failed"; exit 1; }
