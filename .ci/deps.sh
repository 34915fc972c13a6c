#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine, and only what is
# missing: kcat, kafka-python, confluent-kafka (Debian packages, used with
# /usr/bin/python3; python3-snappy for kafka-python; python3-requests and python3-protobuf for
# confluent-kafka's schema registry serializers), file (image-check), chromium (the status
# page's browser test), node/npm and the kafkajs lockfile.
# With CI=true a dependency that is missing and cannot be installed is an
# error; locally it is a warning and the tests that need it report it.
set -euo pipefail
cd "$(dirname "$0")/.."

ci=${CI:-false}
missing=()
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
/usr/bin/python3 -c 'import kafka' >/dev/null 2>&1 || missing+=(python3-kafka)
# kafka-python reads snappy batches (rtproxy's route outputs) only with it.
/usr/bin/python3 -c 'import snappy' >/dev/null 2>&1 || missing+=(python3-snappy)
# ... and zstd batches (views re-encode with the stored codec) only with it.
/usr/bin/python3 -c 'import zstandard' >/dev/null 2>&1 || missing+=(python3-zstandard)
/usr/bin/python3 -c 'import confluent_kafka' >/dev/null 2>&1 || missing+=(python3-confluent-kafka)
# confluent-kafka's schema registry client and ProtobufSerializer
# (test/integration/schema_registry_test.go). Debian has no fastavro, so the
# Avro serializer there is @kafkajs/confluent-schema-registry (npm, below).
/usr/bin/python3 -c 'import requests' >/dev/null 2>&1 || missing+=(python3-requests)
/usr/bin/python3 -c 'import google.protobuf' >/dev/null 2>&1 || missing+=(python3-protobuf)
# protoc generates the Python classes confluent-kafka's ProtobufSerializer is
# given, as applications do (test/integration/protobuf_confluent_test.go).
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v file >/dev/null 2>&1 || missing+=(file)
command -v curl >/dev/null 2>&1 || missing+=(curl)   # the README examples the docs tests run
# Headless, for the status page's browser test (cmd/rtproxy); its fonts
# come with libfontconfig1 (fonts-dejavu-core).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ -f test/integration/package-lock.json ] && ! command -v npm >/dev/null 2>&1; then
	missing+=(nodejs npm)
fi

fail() {
	if [ "$ci" = true ]; then
		echo "deps: $*" >&2
		exit 1
	fi
	echo "deps: warning: $*" >&2
}

if [ ${#missing[@]} -gt 0 ]; then
	sudo=()
	if [ "$(id -u)" -ne 0 ]; then
		if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
			sudo=(sudo -n)
		else
			fail "missing ${missing[*]} and not root (no passwordless sudo); install them with apt-get"
			sudo=(none)
		fi
	fi
	if [ "${sudo[0]:-}" != none ]; then
		echo "deps: installing ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		"${sudo[@]}" apt-get update -qq
		"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
	fi
else
	echo "deps: kcat, python3-kafka, python3-snappy, python3-zstandard, python3-confluent-kafka, python3-requests, python3-protobuf, protobuf-compiler, file, curl, chromium: present"
fi

# kafkajs for the client matrix, pinned by the committed lockfile. npm ci
# wipes node_modules, so it runs only when the lockfile changed since the
# last install (a stamp records its hash).
lock=test/integration/package-lock.json
if [ -f "$lock" ]; then
	stamp=test/integration/node_modules/.rtproxy-lock-sha256
	want=$(sha256sum "$lock" | cut -d' ' -f1)
	if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
		if command -v npm >/dev/null 2>&1; then
			echo "deps: npm ci --prefix test/integration"
			npm ci --prefix test/integration --no-audit --no-fund
			echo "$want" >"$stamp"
		else
			fail "npm is missing; kafkajs tests cannot run"
		fi
	else
		echo "deps: test/integration/node_modules matches package-lock.json"
	fi
fi

# gotestsum, a consumer of go test -json, reads `rtproxy test --format json`
# in cmd/rtproxy/test2json_test.go. Fetched and built through the Go module
# proxy (the version pinned there), so the test's `go run` finds it cached.
gotestsum=gotest.tools/gotestsum@v1.13.0
if ! GOFLAGS=-mod=mod go run "$gotestsum" --version >/dev/null 2>&1; then
	fail "cannot fetch $gotestsum through the Go module proxy"
else
	echo "deps: $gotestsum: present"
fi
