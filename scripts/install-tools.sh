#!/usr/bin/env bash
# Install the Prometheus tools the rule tests need (promtool, amtool; prometheus and alertmanager binaries
# for the end-to-end tests), headless Chromium (the status page's browser test) and cmake/g++/make (to build
# llama-server) from Debian's packages when they are missing. Idempotent; never leaves a daemon
# running. Usage: scripts/install-tools.sh   (as root, or with sudo available)
#
# Debian bookworm gives prometheus 2.42 (promtool) and prometheus-alertmanager 0.25 (alertmanager, amtool).
# Debian bookworm gives victoria-metrics 1.79 (victoria-metrics, vmagent, vmalert): the fleet e2e test.
set -euo pipefail

need_pkgs=()
command -v promtool >/dev/null 2>&1 || need_pkgs+=(prometheus)
command -v prometheus >/dev/null 2>&1 || [[ " ${need_pkgs[*]-} " == *" prometheus "* ]] || need_pkgs+=(prometheus)
if ! command -v amtool >/dev/null 2>&1 || ! command -v prometheus-alertmanager >/dev/null 2>&1; then
  need_pkgs+=(prometheus-alertmanager)
fi
# VictoriaMetrics, vmagent and vmalert: the rules are proven on a second, horizontally scalable ruler.
command -v vmalert >/dev/null 2>&1 || need_pkgs+=(victoria-metrics)
# Headless Chromium: the status page's test looks at it in a real browser.
command -v chromium >/dev/null 2>&1 || need_pkgs+=(chromium)
# A C++ toolchain: scripts/setup-llama-cpp.sh compiles llama-server (the llama.cpp engine tests).
command -v cmake >/dev/null 2>&1 || need_pkgs+=(cmake)
command -v c++ >/dev/null 2>&1 || need_pkgs+=(g++)
command -v make >/dev/null 2>&1 || need_pkgs+=(make)

if [ "${#need_pkgs[@]}" -eq 0 ]; then
  echo "install-tools: promtool $(promtool --version 2>&1 | head -n1 | awk '{print $3}'), amtool, victoria-metrics, chromium, cmake, g++ present; nothing to do"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-tools: need root (or sudo) to install: ${need_pkgs[*]}" >&2
    exit 1
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-tools: apt-get not found; install promtool and amtool (Prometheus >= 2.42, Alertmanager >= 0.25) yourself" >&2
  exit 1
fi

# Keep Debian's postinst scripts from starting the services: policy-rc.d exit 101 = "action forbidden".
# Only add it if there is none, and remove only the one we created.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  created_policy=1
fi
cleanup() { if [ "$created_policy" -eq 1 ]; then $SUDO rm -f "$policy"; fi; }
trap cleanup EXIT

echo "install-tools: installing ${need_pkgs[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"

# Belt and braces: with systemd as init the policy file is honoured by deb-systemd-invoke; without it
# (containers) nothing starts anyway. Stop any daemon that did start, by the units/pids the packages own.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  for unit in prometheus prometheus-alertmanager prometheus-node-exporter victoria-metrics; do
    $SUDO systemctl stop "$unit" >/dev/null 2>&1 || true
    $SUDO systemctl disable "$unit" >/dev/null 2>&1 || true
  done
elif command -v service >/dev/null 2>&1; then
  for svc in prometheus prometheus-alertmanager prometheus-node-exporter victoria-metrics; do
    if [ -x "/etc/init.d/$svc" ]; then $SUDO service "$svc" stop >/dev/null 2>&1 || true; fi
  done
fi

for bin in promtool amtool vmagent vmalert victoria-metrics; do
  command -v "$bin" >/dev/null 2>&1 || { echo "install-tools: $bin still missing after install" >&2; exit 1; }
done
echo "install-tools: $(promtool --version 2>&1 | head -n1); $(amtool --version 2>&1 | head -n1)"
