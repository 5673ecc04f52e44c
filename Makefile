# kvtierfs — the two commands a newcomer runs: `make demo` and `make test`.
GO ?= go
BIN := bin/kvtierfs
# Tests mount real FUSE filesystems one after another; keep packages from
# running concurrently on small machines.
TEST_FLAGS ?= -count=1 -p 1 -timeout 20m

.PHONY: build demo test unit cover deps demo-deps vet lint race clean

# COMMIT reaches `kvtierfs --version` where the toolchain cannot stamp the
# revision itself (git worktrees, GOFLAGS=-buildvcs=false).
COMMIT ?= $(shell git describe --always --dirty=+dirty --abbrev=12 2>/dev/null)

# cgo is optional: without it the daemon is the same and the disk benchmark's
# loaders are Go threads. The engine model's CUDA stage (`bench --gpu cuda`)
# is linked only with TAGS=cuda (cgo, dlopen of libcuda).
CGO_ENABLED ?= 1
TAGS ?=
build:
	CGO_ENABLED=$(CGO_ENABLED) $(GO) build -tags "$(TAGS)" -ldflags "-X main.commit=$(COMMIT)" -o $(BIN) ./cmd/kvtierfs

# demo-deps installs what the demo needs: /dev/fuse, and fuse3 (fusermount3,
# for mounts by non-root users; root mounts directly).
demo-deps:
	@test -e /dev/fuse || { echo "kvtierfs needs /dev/fuse (modprobe fuse)"; exit 1; }
	@command -v fusermount3 >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3; }

# deps installs what `make test` needs beyond the demo: iproute2 and
# util-linux (ip, nsenter: network namespaces in the multi-node tests;
# prlimit: short writes in the fault tests), passwd (useradd: the access
# tests create users), e2fsprogs (mkfs.ext4: the fault tests' loop-device
# store that fills up and fails), glusterfs-server and glusterfs-client
# (glusterd and mount.glusterfs: the shared-store tests' real distributed
# filesystem, integration/gluster), prometheus (promtool: the alert rules
# of deploy/prometheus are checked and unit-tested) and python3-zmq
# (libzmq's SUB socket, the KV events tests' router; its python3 also opens
# regions as vLLM does in the gc-regions race test).
deps: demo-deps
	@pkgs=""; \
	command -v ip >/dev/null || pkgs="$$pkgs iproute2"; \
	command -v nsenter >/dev/null && command -v prlimit >/dev/null || pkgs="$$pkgs util-linux"; \
	command -v useradd >/dev/null || pkgs="$$pkgs passwd"; \
	command -v mkfs.ext4 >/dev/null || pkgs="$$pkgs e2fsprogs"; \
	command -v glusterd >/dev/null || pkgs="$$pkgs glusterfs-server"; \
	command -v mount.glusterfs >/dev/null || pkgs="$$pkgs glusterfs-client"; \
	command -v promtool >/dev/null || pkgs="$$pkgs prometheus"; \
	/usr/bin/python3 -c 'import zmq' 2>/dev/null || pkgs="$$pkgs python3-zmq"; \
	if [ -n "$$pkgs" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkgs; fi

demo: demo-deps build
	./$(BIN) bench --scenario agent

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

test: deps vet
	$(GO) test $(TEST_FLAGS) ./...

# unit runs every test that needs no root and installs nothing: the packages
# that mount FUSE filesystems say they were skipped (mounttest.UnitEnv).
unit: vet
	KVTIERFS_UNIT=1 $(GO) test -count=1 ./...

# cover runs the whole suite with coverage: the unit tests' profile in
# cover/unit.out, and the end-to-end daemons built with -cover write their
# counters under cover/daemon (mounttest.CoverDirEnv).
COVER_DIR := cover
cover: deps
	rm -rf $(COVER_DIR) && mkdir -p $(COVER_DIR)/daemon
	KVTIERFS_COVERDIR=$(CURDIR)/$(COVER_DIR)/daemon $(GO) test $(TEST_FLAGS) -coverprofile=$(COVER_DIR)/unit.out ./...
	$(GO) tool cover -func=$(COVER_DIR)/unit.out | tail -1
	$(GO) tool covdata percent -i=$(COVER_DIR)/daemon

# lint is vet plus staticcheck, fetched from the module proxy at a fixed version.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint: vet
	$(GO) run $(STATICCHECK) ./...
	CGO_ENABLED=0 $(GO) build -o /dev/null ./cmd/kvtierfs

# race runs the unit tests of the concurrent packages under the race detector.
RACE_PKGS := ./fusefs/core/ ./sync/... ./staging/... ./tiers/...
race:
	$(GO) test -count=1 -race $(RACE_PKGS)

clean:
	rm -rf bin $(COVER_DIR)
