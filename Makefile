# Ferry's two entry points are `make run` (the quickstart on local replicas) and `make test`
# (everything CI checks). Both install what they need themselves.

GO      ?= go
BIN     := bin/ferry
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: build run test lint fuzz fmt clean

## build: the one static binary, bin/ferry (grpcnotrace halves it: Dockerfile)
build:
	CGO_ENABLED=0 $(GO) build -tags grpcnotrace -trimpath -ldflags "-s -w -X main.buildVersion=$(VERSION)" -o $(BIN) ./cmd/ferry

## run: bring the quickstart service up on local replicas and print its endpoint
run: build
	$(BIN) serve up configs/examples/quickstart.yaml -y

## test: gofmt, go vet, staticcheck, then every test with the race detector
test:
	./scripts/test.sh

## lint: the static checks alone
lint:
	./scripts/test.sh lint

## fuzz: every fuzz target for FUZZTIME each (default 4s; make test runs this last)
fuzz:
	./scripts/fuzz.sh

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin .cache

# Whole-system benchmarks (bench/README.md). Extra flags go in BENCH_ARGS, for example
# make bench-proxy BENCH_ARGS='--duration 3s --streams5k 1000'.
.PHONY: bench-proxy bench-routing bench-pd bench-tenants bench-sim bench-gang bench-updates bench-faults bench-kubescale

## bench-proxy: proxy cost on loopback, backend direct vs ferry proxy vs nginx (installs nginx if missing)
bench-proxy:
	./scripts/bench-deps.sh
	$(GO) run ./bench/proxyload $(BENCH_ARGS)

## bench-routing: routing quality per policy, replica-sim replicas replaying the Azure conversation trace
bench-routing:
	$(GO) run ./bench/routing $(BENCH_ARGS)

## bench-pd: a disaggregated service's prefill and decode pools scaling apart as the mix shifts from the Azure code trace to the conversation trace
bench-pd:
	$(GO) run ./bench/pdscale $(BENCH_ARGS)

## bench-tenants: managed keys through two attached proxies: a light tenant's TTFT beside a saturating one, a daily token limit across proxies, batch shed before interactive, ferry usage against the replicas' reports, a managed key's CPU cost in the proxy
bench-tenants:
	$(GO) run ./bench/tenants $(BENCH_ARGS)

## bench-sim: the fleet-size sweep (ferry sim --sweep): every spot trace in ../shared/data and a GCP counted set derived from them, at 3, 4, 5, 6, 8, 12, 16 and 24 replicas, Ferry against SkyServe+SpotHedge and all on-demand
bench-sim:
	$(GO) run ./cmd/ferry sim --sweep $(BENCH_ARGS)

## bench-gang: cost per unit of work, N×1-GPU spot against 1×N-GPU on-demand for a data-parallel job on the spot preemption traces (ferry sim gang)
bench-gang:
	$(GO) run ./cmd/ferry sim gang $(BENCH_ARGS)

## bench-updates: serve update under load (rolling, blue-green, crash + rollback, controller killed): failed requests, versions served
bench-updates:
	$(GO) run ./bench/updates $(BENCH_ARGS)

## bench-faults: one fault at a time under load: replicas and the controller (replica killed, hung, flapping, 500s/slow, controller killed, disk full, connections exhausted; bench/faults), then whole infras (GCP 503, a zone 404, EC2 hung and throttling, the Kubernetes API server stopped, a cloud that recovers; bench/infrafaults)
bench-faults:
	$(GO) run ./bench/faults $(BENCH_ARGS)
	$(GO) run ./bench/infrafaults $(INFRA_BENCH_ARGS)

## bench-kubescale: issue 36's scale scenario on the test cluster: 100 services × 10 replica pods (kwok nodes, replica-sim served in the kubelet stand-in) under two leader-elected controllers: READY after the last serve up, the leader's RSS and reconcile p99, kill -9 of the leader under load, serve down -a
bench-kubescale:
	$(GO) run ./bench/kubescale $(BENCH_ARGS)
