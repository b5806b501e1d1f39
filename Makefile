# Snip: a URL shortener whose clicks flow over NATS JetStream to independent
# readers. `make help` lists the targets. CI runs `bash .ci/run`, which runs
# `make test`.
#
# Narrow a run with PKG= (a package pattern, default every module) and T= (a
# test name regexp), e.g. `make test PKG=./services/redirect/... T=Outbox`.

SHELL := /bin/bash
GO ?= go
# Every module of the workspace, for the per-module (GOWORK=off) checks.
MODULES := pkg $(wildcard services/*) loadtest deploy/check
PKG ?= work
T ?= .
TEST_FLAGS ?= -race -shuffle=on -count=1 -timeout 20m
DEMO_DIR ?= .demo
# More flags for snipctl demo, e.g. DEMO_FLAGS=--shrink-retention.
DEMO_FLAGS ?=
BIN := $(DEMO_DIR)/bin
SERVICES := $(notdir $(wildcard services/*))

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build every service binary into .demo/bin
	@mkdir -p $(BIN)
	@echo "building $(words $(SERVICES)) services and the load test into $(BIN) (the first build compiles every dependency: a minute or two)"
	@for s in $(SERVICES); do \
		start=$$(date +%s); printf '  %-13s' "$$s"; \
		$(GO) build -o $(BIN)/$$s ./services/$$s || exit 1; \
		echo " $$(( $$(date +%s) - start ))s"; \
	done
	@start=$$(date +%s); printf '  %-13s' loadtest; $(GO) build -o $(BIN)/loadtest ./loadtest && echo " $$(( $$(date +%s) - start ))s"

.PHONY: demo
demo: build ## run the whole system on this machine (embedded NATS, local Redis and ClickHouse)
	$(BIN)/snipctl demo --dir $(DEMO_DIR) --bin $(BIN) $(DEMO_FLAGS)

.PHONY: demo-cluster
demo-cluster: build ## the demo on a 3-node NATS cluster (R3) and a Redis Cluster (3 masters + 3 replicas): kill a node and watch
	$(BIN)/snipctl demo --cluster --dir $(DEMO_DIR) --bin $(BIN) $(DEMO_FLAGS)

.PHONY: test
test: servers modules ## every test, against real NATS (embedded), Redis and ClickHouse
	$(GO) vet work
	$(GO) test $(TEST_FLAGS) -run '$(T)' $(PKG)

.PHONY: servers
servers: ## install redis-server, clickhouse-server and chromium (the console's browser tests) from the distribution if missing (Debian/Ubuntu)
	@bash .ci/install-servers

.PHONY: modules
modules: ## build and vet each module on its own (GOWORK=off), so no require hides behind go.work
	@for m in $(MODULES); do \
		echo "== $$m (GOWORK=off)"; \
		(cd $$m && GOWORK=off $(GO) build ./... && GOWORK=off $(GO) vet ./...) || exit 1; \
	done

.PHONY: test-short
test-short: ## the tests without the slow chaos and load suites (-short)
	$(GO) test -short -count=1 -run '$(T)' $(PKG)

.PHONY: bench
bench: ## Go benchmarks (handlers, encoders, readers); see docs/benchmarks.md
	$(GO) test -run '^$$' -bench '$(T)' -benchmem -count=1 $(PKG)

.PHONY: lint
lint: ## gofmt check and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet work

.PHONY: loadtest
loadtest: build ## a short load test against a running `make demo` (links point at the demo's local site)
	$(BIN)/loadtest http --rate 2000 --duration 30s --verify --link-base http://127.0.0.1:8089/articles

# make loadtest-compose: the same short load test from the compose stack's
# loadtest service (`make up` first; COMPOSE=docker-compose.cluster.yml for
# `make up-cluster`). Its report lands in loadtest/reports/<time>-<tag>/,
# made first and written as the caller's user (the image's own user could
# not write a folder of the host's).
COMPOSE ?= docker-compose.yml

.PHONY: loadtest-compose
loadtest-compose: ## the short load test from compose's loadtest service, against `make up` (report in loadtest/reports)
	mkdir -p loadtest/reports
	SNIP_LOADTEST_USER=$$(id -u):$$(id -g) docker compose -f $(COMPOSE) --profile loadtest run --rm loadtest

# make chaos: each fault in turn against a running `make demo` (default
# ports), under HTTP load, judged by the oracle. PIDs are looked up when each
# fault starts; a killed service is restarted by `make demo`. Override the
# list with CHAOS_FAULTS (specs: loadtest chaos -h).
CHAOS_FREEZE ?= 20s
CHAOS_ARGS ?= --rate 1000 --require counter,warehouse
CHAOS_FAULTS ?= \
	--fault 'freeze:redis:pgrep -nf "redis-serve[r] 127.0.0.1.6390":$(CHAOS_FREEZE)' \
	--fault 'freeze:nats:pgrep -nx snipctl:$(CHAOS_FREEZE)' \
	--fault 'freeze:clickhouse:pgrep -nf clickhouse-serve[r]:$(CHAOS_FREEZE)' \
	--fault 'kill:redirect:pgrep -nx redirect' \
	--fault 'kill:clickcounter:pgrep -nx clickcounter' \
	--fault 'kill:fraud:pgrep -nx fraud' \
	--fault 'kill:warehouse:pgrep -nx warehouse'

.PHONY: chaos
chaos: build ## the fault suite against a running `make demo`: freeze Redis, NATS, ClickHouse; kill -9 the redirect, the counter, fraud detection and the warehouse loader
	$(BIN)/loadtest chaos $(CHAOS_ARGS) $(CHAOS_FAULTS)

.PHONY: up
up: ## docker compose up (needs a Docker engine)
	docker compose up --build -d

.PHONY: down
down: ## docker compose down
	docker compose down

.PHONY: up-cluster
up-cluster: ## docker compose up on a 3-node NATS cluster and a Redis Cluster (docker-compose.cluster.yml; needs a Docker engine)
	docker compose -f docker-compose.cluster.yml up --build -d

.PHONY: down-cluster
down-cluster: ## docker compose down for docker-compose.cluster.yml
	docker compose -f docker-compose.cluster.yml down

.PHONY: compose-check
compose-check: ## validate both compose files, the Dockerfile, NATS users and alert rules without a Docker engine
	$(GO) test -count=1 ./deploy/check/

.PHONY: generate
generate: ## regenerate deploy/nats from deploy/check/natsconf.go
	$(GO) run ./deploy/check/cmd/natsconf -partitions 8

.PHONY: tidy
tidy: ## go mod tidy in every module
	@for m in $(MODULES); do (cd $$m && $(GO) mod tidy) || exit 1; done

.PHONY: clean
clean: ## remove the demo's binaries and data
	rm -rf $(DEMO_DIR)
