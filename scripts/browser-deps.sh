#!/usr/bin/env bash
# Debian's chromium for the console's browser test (tests/integration/test_console_browser.py), which
# Playwright drives through its executable_path (`playwright install` downloads a browser of its own,
# which this machine cannot). Installs it with apt-get when `command -v chromium` finds none (needs
# root; CI runs as root). Prints the browser's path.
set -euo pipefail
log() { echo "browser-deps: $*" >&2; }
if ! command -v chromium >/dev/null; then
  [ "$(id -u)" = 0 ] || { log "chromium is not installed; install it: sudo apt-get install -y chromium"; exit 1; }
  log "installing chromium with apt-get ..."
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium >&2
fi
command -v chromium
