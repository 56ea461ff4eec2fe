#!/usr/bin/env bash
# Fetch the multimodal datasets into a cache folder (idempotent, never fails CI when offline).
#
#   .ci/fetch_multimodal_data.sh <cache>
#
# <cache>/openclipart  Open Clip Art 0.18, the Debian packages openclipart-png and openclipart-svg
#                      unpacked with `dpkg -x` (images under usr/share/openclipart/{png,svg}/);
# <cache>/emoji        the npm package emoji-datasource-google@16.0.0 (files under package/).
#
# Point the loaders at them with
#   HIERGRAPH_OPENCLIPART=<cache>/openclipart/usr/share/openclipart
#   HIERGRAPH_EMOJI=<cache>/emoji/package
# Anything already unpacked is skipped; a failed download prints a warning and exits 0,
# so the tests that need the data skip instead.
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 <cache dir>" >&2
  exit 2
fi
cache="$1"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"
EMOJI_VERSION="16.0.0"

warn() { echo "fetch_multimodal_data: WARNING: $*; tests that need it will skip" >&2; }

fetch_deb() {  # fetch_deb <package> <marker dir inside usr/share/openclipart>
  local pkg="$1" marker="$cache/openclipart/usr/share/openclipart/$2"
  if [ -d "$marker" ]; then
    echo "fetch_multimodal_data: $pkg already unpacked in $cache/openclipart"
    return 0
  fi
  local tmp
  tmp="$(mktemp -d)"
  if (cd "$tmp" && apt-get download "$pkg" >/dev/null 2>&1) && ls "$tmp"/"$pkg"_*.deb >/dev/null 2>&1; then
    mkdir -p "$cache/openclipart"
    if dpkg -x "$tmp"/"$pkg"_*.deb "$cache/openclipart"; then
      echo "fetch_multimodal_data: unpacked $pkg into $cache/openclipart"
    else
      warn "dpkg -x failed for $pkg"
    fi
  else
    warn "could not download the Debian package $pkg (offline, or no apt source lists it)"
  fi
  rm -rf "$tmp"
}

fetch_emoji() {
  if [ -f "$cache/emoji/package/emoji.json" ]; then
    echo "fetch_multimodal_data: emoji-datasource-google already unpacked in $cache/emoji"
    return 0
  fi
  local tmp
  tmp="$(mktemp -d)"
  if command -v npm >/dev/null 2>&1 \
      && (cd "$tmp" && npm pack "emoji-datasource-google@$EMOJI_VERSION" >/dev/null 2>&1); then
    mkdir -p "$cache/emoji"
    if tar -xzf "$tmp"/emoji-datasource-google-*.tgz -C "$cache/emoji"; then
      echo "fetch_multimodal_data: unpacked emoji-datasource-google into $cache/emoji"
    else
      warn "could not untar emoji-datasource-google"
    fi
  else
    warn "could not fetch emoji-datasource-google@$EMOJI_VERSION with npm"
  fi
  rm -rf "$tmp"
}

fetch_deb openclipart-png png
fetch_deb openclipart-svg svg
fetch_emoji
exit 0
