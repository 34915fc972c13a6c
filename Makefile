# rtproxy — `make test` is THE test command (CI runs exactly it via .ci/run).
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
BIN      := bin/rtproxy
QUICKSTART_CONFIG := examples/quickstart/rtproxy.yaml
FUZZTIME ?= 10s
FUZZPKGS ?= ./...

.PHONY: build run test deps vet unit helm-check image-check bench-proxy bench-guard bench-tap bench-pipeline bench-eo bench-reload bench-switch bench-scale bench-footprint soak fuzz fuzz-shapes clean

## build: the static, version-stamped binary in bin/rtproxy
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/rtproxy

## run: build, then run with the quickstart config (embedded broker) when present.
## Without it, the defaults run in .run/, because ./rules and ./state at the
## repository root are Go packages, not a rules directory and a state directory.
run: build
	@if [ -f $(QUICKSTART_CONFIG) ]; then \
		echo "+ $(BIN) run --config $(QUICKSTART_CONFIG)"; exec $(BIN) run --config $(QUICKSTART_CONFIG); \
	else \
		mkdir -p .run; cd .run; echo "+ (cd .run && ../$(BIN) run)"; exec ../$(BIN) run; \
	fi

## test: the CI entry point: dependencies, vet, every test, chart and image checks,
## in this order even under make -j
test:
	$(MAKE) deps --no-print-directory
	$(MAKE) vet --no-print-directory
	$(MAKE) unit --no-print-directory
	$(MAKE) helm-check --no-print-directory
	$(MAKE) image-check --no-print-directory

## vet: go.mod and go.sum as `go mod tidy` would write them, then go vet
vet:
	$(GO) mod tidy -diff
	$(GO) vet ./...

unit:
	$(GO) test -count=1 -timeout 14m ./...

## deps: install what the tests need on a fresh Debian machine (only what is missing)
deps:
	.ci/deps.sh

## helm-check: lint and render the chart, check its rules and ports (deploy/scripts)
helm-check:
	deploy/scripts/helm-check.sh

## image-check: verify the image build without a Docker engine (deploy/scripts)
image-check:
	deploy/scripts/image-check.sh

bench-proxy:
	$(GO) run ./test/bench/proxy $(ARGS)

## bench-guard: produce throughput through the proxy with a guard against without (docs/BENCHMARKS.md)
bench-guard:
	$(GO) run ./test/bench/guard

## bench-tap: produce-to-sink latency with the produce-path tap on and off, against the floor (docs/BENCHMARKS.md)
bench-tap:
	$(GO) run ./test/bench/tap

## bench-join: the stream join at 100k buffered records per side, one core (docs/BENCHMARKS.md)
.PHONY: bench-join
bench-join:
	$(GO) test -run '^$$' -bench StreamJoin100kBuffered -benchmem -cpu 1 -benchtime 200000x ./operators/

bench-pipeline:
	$(GO) run ./test/bench/pipeline

## bench-eo: exactly_once against at_least_once routes: latency, CPU per record, drain (docs/BENCHMARKS.md)
bench-eo:
	$(GO) run ./test/bench/exactlyonce

## bench-switch: a route ending in a switch to 3 sinks against the same route with one sink, ten alternated rounds (docs/BENCHMARKS.md)
bench-switch:
	$(GO) test -c -o $${TMPDIR:-/tmp}/rtproxy-pipeline.test ./pipeline
	cd pipeline && for i in 1 2 3 4 5 6 7 8 9 10; do for c in single-sink switch-3-sinks; do \
		$${TMPDIR:-/tmp}/rtproxy-pipeline.test -test.run '^$$' -test.bench "BenchmarkSwitchSinks/$$c\$$" -test.benchmem -test.benchtime 100000x -test.cpu 1 | grep Benchmark; \
	done; done

bench-reload:
	$(GO) run ./test/bench/reload

## bench-scale: 1-3 rtproxy instances sharing routes, changelog restore, repartition hop (docs/BENCHMARKS.md)
bench-scale:
	$(GO) run ./test/bench/scale

## bench-footprint: an idle sidecar's RSS, CPU and threads (pass-through, the quickstart's routes, more idle routes);
## ARGS='-base REV' measures REV's binary alongside, alternated (docs/BENCHMARKS.md)
bench-footprint:
	$(GO) run ./test/bench/footprint $(ARGS)

## soak: 10-minute chaos soak of two routes; nothing lost, RSS bounded (docs/BENCHMARKS.md)
soak:
	$(GO) run ./test/bench/soak

## fuzz: run every fuzz target of FUZZPKGS (default ./...) for FUZZTIME (default 10s) each
fuzz:
	@for pkg in $$($(GO) list $(FUZZPKGS)); do \
		for t in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz' || true); do \
			echo "+ go test -run '^$$' -fuzz '^$$t$$' -fuzztime $(FUZZTIME) $$pkg"; \
			$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

## fuzz-shapes: the differential test of route shapes (test/shapes) for SHAPES_DURATION
## (default 3m) from SHAPES_SEED (default: the clock); prints the number of shapes run
SHAPES_DURATION ?= 3m
fuzz-shapes:
	SHAPES_SEED=$${SHAPES_SEED:-$$(date +%s)}; echo "+ first seed $$SHAPES_SEED"; \
	SHAPES_SEED=$$SHAPES_SEED SHAPES_DURATION=$(SHAPES_DURATION) $(GO) test -count=1 -v -timeout 0 -run '^(TestShapesDriver|TestShapesSessionsDriver)$$' ./test/shapes/

clean:
	rm -rf bin dist
