# ibvbridge: `make demo` shows the whole path, `make test` runs every suite. Both install what they need
# (scripts/setup.sh: Debian packages, Go modules, hugepages; root for the last two steps of that).
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
export PYENV_VERSION := system
PYTHON := /usr/bin/python3
GO ?= go

.PHONY: all setup build test test-go test-c test-python test-interop test-docs docs bench-report fuzz soak soak-service demo bench clean install install-systemd sim \
	deb images test-deploy test-deb test-images test-helm

all: build

setup:
	@scripts/setup.sh

build:
	$(GO) build -o bin/ibvbridge ./cmd/ibvbridge
	$(MAKE) -s -C clients/c

test: setup build
	@echo "== go vet"
	$(GO) vet ./...
	@echo "== C client tests"
	$(MAKE) -s -C clients/c test
	@echo "== Python client type check (mypy; strictness in clients/python/pyproject.toml)"
	cd clients/python && $(PYTHON) -m mypy --cache-dir=/dev/null  # writes no cache into the tree
	@echo "== Python client tests"
	@# pytest keeps its last three tmp_path trees under /tmp/pytest-of-USER: give it one of ours and remove it
	t=$$(mktemp -d) && cd clients/python && { $(PYTHON) -m pytest -q -p no:cacheprovider --basetemp=$$t/pytest tests; rc=$$?; rm -rf $$t; exit $$rc; }
	@echo "== systemd unit"
	scripts/check-unit.sh
	@echo "== Prometheus alerting rules (Prometheus's own rule parser; a module of its own)"
	cd deploy/prometheus/rulecheck && $(GO) test -count=1 ./
	@$(MAKE) -s test-docs
	@echo "== The ring simulation replayed against the Go, C and Python producers (internal/ringsim/replay.go)"
	@# the whole log only when it fails; else the steps each producer played
	out=$$(mktemp) && { SIM_REPLAY_STEPS=$(SIM_REPLAY_STEPS) IBVBRIDGE_REQUIRE_CLIENTS=1 $(GO) test -count=1 -timeout 20m -v \
	  -run '^TestSimReplay' ./ring/ ./internal/ringsim/ > $$out 2>&1; rc=$$?; \
	  if [ $$rc -eq 0 ]; then grep -E 'steps of' $$out; else cat $$out; fi; rm -f $$out; exit $$rc; }
	@echo "== Go tests (race detector), cross-language tests and fuzz seed corpora"
	IBVBRIDGE_REQUIRE_CLIENTS=1 SIM_TARGETS=go,c,py $(GO) test -race -count=1 ./...
	@echo "== Debian packages, container images, Helm chart (docs/deploy.md)"
	$(MAKE) -s test-deploy

# The docs site (MkDocs + Material, Debian packages) with the reference pages generated from the code:
# build/docs/site. test-docs also opens every page in headless Chromium (links, anchors, empty pages,
# every flag in the CLI reference) and runs every recipe of README.md and docs/ as pasted.
docs: build
	@scripts/docs/build.sh

test-docs: build
	@echo "== docs site: every page in Chromium, links, anchors, flag coverage"
	CHECK=1 scripts/docs/build.sh
	$(PYTHON) scripts/docs/check_c_types.py
	@echo "== benchmark figures only on the generated page (docs/reference/benchmarks.md)"
	$(PYTHON) scripts/docs/check_bench_figures.py
	@echo "== docs recipes, as pasted (python3 on PATH without numpy)"
	$(PYTHON) scripts/docs/run_recipes.py

# The ring simulation (internal/ringsim) for SIM_SECONDS: seeded scenarios against the model on every core,
# then in lockstep against the producers SIM_TARGETS names (go, c, py; default go) for half as long, then
# SIM_REPLAY_STEPS steps of the replay stream against each producer (make sim: 10⁸); a failing seed prints
# its one-line reproduction. make test runs the short budget: TestSim 20 s, lockstep 10 s in all, 10⁷
# replayed steps on each producer.
SIM_SECONDS ?= 300
SIM_REPLAY_STEPS ?= 10000000
SIM_TARGETS ?= go
sim:
	SIM_STRICT=1 SIM_SECONDS=$(SIM_SECONDS) SIM_TARGETS=$(SIM_TARGETS) $(GO) test -count=1 -timeout 0 -v -run '^(TestSim|TestSimProducers)$$' ./internal/ringsim/
	SIM_REPLAY_STEPS=$(if $(filter command line environment,$(origin SIM_REPLAY_STEPS)),$(SIM_REPLAY_STEPS),100000000) \
	  $(GO) test -count=1 -timeout 0 -v -run '^TestSimReplay' ./ring/ ./internal/ringsim/

# A fuzzing session on every parser and the assembler, and on both sides of the ring's trust boundary
# (hello records and consumer regions as the producer reads them; header, descriptors, item tables and
# metadata as the Go client reads them), FUZZTIME each (not part of make test). Each target
# makes well over 100 k executions a minute here; new findings land in testdata/fuzz/ as regression seeds.
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./spead/
	$(GO) test -run '^$$' -fuzz '^FuzzParseDescriptor$$' -fuzztime $(FUZZTIME) ./spead/
	$(GO) test -run '^$$' -fuzz '^FuzzAssembler$$' -fuzztime $(FUZZTIME) ./spead/assemble/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./frame/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeHello$$' -fuzztime $(FUZZTIME) ./ring/
	$(GO) test -run '^$$' -fuzz '^FuzzProducerReadsRegion$$' -fuzztime $(FUZZTIME) ./ring/
	$(GO) test -run '^$$' -fuzz '^FuzzParseHeader$$' -fuzztime $(FUZZTIME) ./ring/
	$(GO) test -run '^$$' -fuzz '^FuzzValidateHeap$$' -fuzztime $(FUZZTIME) ./ring/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeMeta$$' -fuzztime $(FUZZTIME) ./ring/
	$(GO) test -run '^$$' -fuzz '^FuzzChunkPlacement$$' -fuzztime $(FUZZTIME) ./spead/assemble/
	$(GO) test -run '^$$' -fuzz '^FuzzChunkPlaceFunc$$' -fuzztime $(FUZZTIME) ./spead/assemble/

# SOAK_SECONDS (default 600) of send → recv with consumers killed and restarted and recv restarted twice;
# every heap accounted for, recv's memory flat (scripts/soak.sh). Not part of make test.
soak: build
	scripts/soak.sh

# recv as a service: `recv --keep-going` under a notify socket with a 1 s watchdog through SOAK_STREAMS (200)
# streams paced over SOAK_SECONDS (600) — senders stopping, restarting without a stop, killed mid-stream —
# read across the boundaries by Go, C and Python consumers; every heap of every stream accounted, recv's
# RSS and descriptors flat, the watchdog never missed (interop TestServiceSoak; make test runs it short).
SOAK_STREAMS ?= 200
soak-service: build
	IBVBRIDGE_REQUIRE_CLIENTS=1 IBVBRIDGE_SOAK_STREAMS=$(SOAK_STREAMS) IBVBRIDGE_SOAK_SECONDS=$(or $(SOAK_SECONDS),600) \
	  $(GO) test -count=1 -timeout 30m -run '^TestServiceSoak$$' -v ./interop/

demo: setup build
	@scripts/demo.sh

# docs/reference/benchmarks.md from the benchmarks' own --json output (command, date, commit, machine,
# load, spread): BENCH_REPEATS times each (default 3); BENCH_ONLY=ring,group rewrites those sections and
# keeps the others. spead2's rows only where spead2_recv (and, for Python, spead2's package) is installed.
BENCH_REPEATS ?= 3
BENCH_ONLY ?=
bench-report: build
	nice $(PYTHON) scripts/bench_report.py --repeats $(BENCH_REPEATS) $(if $(BENCH_ONLY),--only $(BENCH_ONLY))

bench: build
	bin/ibvbridge bench ring --consumer c --heap-size 64
	bin/ibvbridge bench ring --consumer python --heap-size 64 --batch 4096
	bin/ibvbridge bench ring --consumer c --heap-size 1048576

PREFIX ?= /usr/local
install: build
	install -D -m 0755 bin/ibvbridge $(DESTDIR)$(PREFIX)/bin/ibvbridge
	$(MAKE) -s -C clients/c install PREFIX=$(PREFIX) DESTDIR=$(DESTDIR)

# The template unit, an example configuration, the hugepage sysctl and the ibvbridge user and group
# (README "Running under systemd"). Existing configuration files are left as they are.
install-systemd: install
	getent group ibvbridge >/dev/null || groupadd --system ibvbridge
	id -u ibvbridge >/dev/null 2>&1 || useradd --system --gid ibvbridge --home-dir /nonexistent --shell /usr/sbin/nologin ibvbridge
	install -D -m 0644 deploy/systemd/ibvbridge@.service $(DESTDIR)/etc/systemd/system/ibvbridge@.service
	install -d -m 0755 $(DESTDIR)/etc/ibvbridge
	[ -e $(DESTDIR)/etc/ibvbridge/example.conf ] || install -m 0644 deploy/etc/example.conf $(DESTDIR)/etc/ibvbridge/example.conf
	[ -e $(DESTDIR)/etc/sysctl.d/60-ibvbridge.conf ] || install -D -m 0644 deploy/etc/sysctl.conf $(DESTDIR)/etc/sysctl.d/60-ibvbridge.conf
	-systemctl daemon-reload

# Deployment (docs/deploy.md): Debian packages in build/deb, OCI images in build/images, the Helm chart in
# deploy/helm/ibvbridge. The deploy tooling are Go modules of their own (deploy/images, deploy/helm/chartcheck);
# helm is built once from the Go module proxy into TOOLS, outside the tree.
TOOLS ?= $(HOME)/.cache/ibvbridge-tools
HELM_VERSION := v3.22.0
HELM := $(TOOLS)/helm-$(HELM_VERSION)

deb:
	scripts/build-deb.sh

images: deb
	scripts/build-images.sh

$(HELM):
	@mkdir -p $(TOOLS)
	@echo "== building helm $(HELM_VERSION) from the Go module proxy into $(TOOLS) (once)"
	@t0=$$(date +%s); GOBIN=$(TOOLS)/.gobin GOFLAGS=-trimpath nice $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION) && \
	  mv $(TOOLS)/.gobin/helm $@ && rmdir $(TOOLS)/.gobin && echo "helm built in $$(( $$(date +%s) - t0 )) s"

test-deploy: test-deb test-images test-helm

test-deb: deb
	scripts/test-deb.sh

test-images: deb
	scripts/test-images.sh

test-helm: $(HELM)
	cd deploy/helm/chartcheck && $(GO) vet ./... && HELM=$(HELM) $(GO) test -count=1 ./...
	cd deploy/images && $(GO) vet ./...

clean:
	rm -rf bin build
	$(MAKE) -s -C clients/c clean
