#!/usr/bin/env bash
# image-check: what `make image-check` (and `make test`) runs for the
# Dockerfile. There is no Docker engine here, so it checks what it can:
#  1. deploycheck image: the Dockerfile's base images, user, paths, ports,
#     entrypoint and command agree with the chart (rendered with default
#     values) and with the config the image carries; .dockerignore keeps
#     everything the build needs;
#  2. the Dockerfile's own `go build` line, run on this host, gives a static
#     (file: statically linked; ldd: not a dynamic executable), stripped
#     binary that reports the stamped version.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
. deploy/scripts/lib.sh

for tool in file ldd; do
	command -v "$tool" >/dev/null || { echo "image-check: FAIL: '$tool' is not installed (make deps installs it)" >&2; exit 1; }
done
HELM=$(ensure_helm)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/image-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

go build -o "$WORK/deploycheck" ./deploy/deploycheck
"$HELM" template rtp-check deploy/helm/rtproxy >"$WORK/chart.yaml"
version="image-check-$$"
echo "image-check: Dockerfile against the chart, then the Dockerfile's build command"
if "$WORK/deploycheck" image -dockerfile Dockerfile -dockerignore .dockerignore \
	-rendered "$WORK/chart.yaml" -image-config deploy/docker/rtproxy.yaml \
	-build-out "$WORK/rtproxy" -version "$version"; then
	ok "Dockerfile user, paths, ports and command match the chart"
else
	fail "deploycheck image (above)"
fi

if [ -x "$WORK/rtproxy" ]; then
	desc=$(file -b "$WORK/rtproxy")
	if grep -q "statically linked" <<<"$desc"; then ok "file: $desc"; else fail "file says: $desc (want statically linked)"; fi
	if grep -q ", stripped" <<<"$desc"; then ok "stripped (-s -w)"; else fail "not stripped: $desc"; fi
	lddout=$(ldd "$WORK/rtproxy" 2>&1 || true)
	if grep -q "not a dynamic executable" <<<"$lddout"; then ok "ldd: $lddout"; else fail "ldd lists dependencies: $lddout"; fi
	v=$("$WORK/rtproxy" version 2>&1 || true)
	if grep -qF "$version" <<<"$v"; then ok "version stamped: $v"; else fail "rtproxy version prints '$v', want it to contain $version (-X main.version)"; fi
else
	fail "no binary was built"
fi

if [ "$failures" -gt 0 ]; then
	echo "image-check: $failures failure(s)" >&2
	exit 1
fi
echo "image-check: ok"
