# kvtierfs — the two commands a newcomer runs: `make demo` and `make test`.
GO ?= go
BIN := bin/kvtierfs
# Tests mount real FUSE filesystems one after another; keep packages from
# running concurrently on small machines. -tags bench: cmd/kvtierfs's tests
# cover `kvtierfs bench` in the benchmark build (below).
TEST_FLAGS ?= -count=1 -p 1 -timeout 20m -tags bench

.PHONY: build demo test unit cover deps demo-deps vet lint race arm64 arm64-e2e pages release clean

# COMMIT reaches `kvtierfs --version` where the toolchain cannot stamp the
# revision itself (git worktrees, GOFLAGS=-buildvcs=false).
COMMIT ?= $(shell git describe --always --dirty=+dirty --abbrev=12 2>/dev/null)
# VERSION is the release tag (v*) this tree is at or after, else 0.0.0-COMMIT.
VERSION ?= $(shell git describe --tags --match 'v[0-9]*' --dirty=+dirty 2>/dev/null || echo 0.0.0-$(COMMIT))
LDFLAGS := -X main.commit=$(COMMIT) -X main.version=$(VERSION)

# cgo is optional: without it the daemon is the same and the disk benchmark's
# loaders are Go threads. The engine model's CUDA stage (`bench --gpu cuda`)
# is linked only with TAGS=cuda (cgo, dlopen of libcuda).
# build writes two binaries: BIN, the daemon a node runs, which links no
# benchmark or test harness, and BIN-bench, the benchmark build (-tags
# bench: the same command plus the engine model and the daemon harness of
# integration/), which `BIN bench` execs.
CGO_ENABLED ?= 1
TAGS ?=
build:
	CGO_ENABLED=$(CGO_ENABLED) $(GO) build -tags "$(TAGS)" -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/kvtierfs
	CGO_ENABLED=$(CGO_ENABLED) $(GO) build -tags "bench $(TAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)-bench ./cmd/kvtierfs

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
# of deploy/prometheus are checked and unit-tested), python3-zmq (libzmq's
# SUB socket, the KV events tests' router; its python3 also opens regions as
# vLLM does in the gc-regions race test), qemu-user-static
# (qemu-aarch64-static: the arm64 tests, `make arm64`), gcc-aarch64-linux-gnu
# (the arm64 cgo build of `make lint`) and podman (the release test builds
# the image from the Dockerfile, no registry needed).
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
	command -v qemu-aarch64-static >/dev/null || pkgs="$$pkgs qemu-user-static"; \
	command -v $(ARM64_CC) >/dev/null || pkgs="$$pkgs gcc-aarch64-linux-gnu"; \
	command -v podman >/dev/null || pkgs="$$pkgs podman"; \
	if [ -n "$$pkgs" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkgs; fi

demo: demo-deps build
	./$(BIN) bench --scenario agent

vet:
	$(GO) vet ./...
	$(GO) vet -tags bench ./cmd/kvtierfs
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

test: deps vet
	$(GO) test $(TEST_FLAGS) ./...

# unit runs every test that needs no root and installs nothing: the packages
# that mount FUSE filesystems say they were skipped (mounttest.UnitEnv).
unit: vet
	KVTIERFS_UNIT=1 $(GO) test -count=1 -tags bench ./...

# cover runs the whole suite with coverage: the unit tests' profile in
# cover/unit.out, and the end-to-end daemons built with -cover write their
# counters under cover/daemon (mounttest.CoverDirEnv).
COVER_DIR := cover
cover: deps
	rm -rf $(COVER_DIR) && mkdir -p $(COVER_DIR)/daemon
	KVTIERFS_COVERDIR=$(CURDIR)/$(COVER_DIR)/daemon $(GO) test $(TEST_FLAGS) -coverprofile=$(COVER_DIR)/unit.out ./...
	$(GO) tool cover -func=$(COVER_DIR)/unit.out | tail -1
	$(GO) tool covdata percent -i=$(COVER_DIR)/daemon

# lint is vet plus staticcheck, fetched from the module proxy at a fixed
# version, and the whole module built and vetted for linux/arm64 without cgo
# and with it (cross compiler $(ARM64_CC), CUDA stage included).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
ARM64_CC ?= aarch64-linux-gnu-gcc
lint: vet
	$(GO) run $(STATICCHECK) ./...
	$(GO) run $(STATICCHECK) -tags bench ./cmd/kvtierfs
	CGO_ENABLED=0 $(GO) build -o /dev/null ./cmd/kvtierfs
	CGO_ENABLED=0 $(GO) build -tags bench -o /dev/null ./cmd/kvtierfs
	GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build ./...
	GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) vet ./...
	GOOS=linux GOARCH=arm64 CGO_ENABLED=1 CC=$(ARM64_CC) $(GO) build -tags "bench cuda" ./...
	GOOS=linux GOARCH=arm64 CGO_ENABLED=1 CC=$(ARM64_CC) $(GO) vet -tags "bench cuda" ./...

# arm64 runs the unit tests cross-built for arm64 under qemu-user, arm64-e2e
# the end-to-end tests an arm64 daemon can pass under qemu-user on this
# kernel (.ci/arm64 says which cannot, and why).
arm64:
	.ci/arm64 unit $(ARM64_PKGS)
arm64-e2e:
	.ci/arm64 e2e $(ARM64_PKGS)

# pages runs the page-size rules again at 64 KiB, a Grace kernel's page
# (block.TestPageSizeEnv), whatever this machine's page is.
PAGE_PKGS := ./tiers/... ./sync/rowsync/
pages:
	KVTIERFS_TEST_PAGE_SIZE=65536 $(GO) test $(TEST_FLAGS) $(PAGE_PKGS)

# release builds static kvtierfs binaries (CGO_ENABLED=0) for linux/amd64
# and linux/arm64 with VERSION and COMMIT stamped, a tarball per
# architecture with the deploy files, and SHA256SUMS, into RELEASE_DIR.
RELEASE_DIR ?= dist
release:
	VERSION=$(VERSION) LDFLAGS="$(LDFLAGS)" .ci/release $(RELEASE_DIR)

# race runs the unit tests of the concurrent packages under the race detector.
RACE_PKGS := ./fusefs/core/ ./sync/... ./staging/... ./tiers/...
race:
	$(GO) test -count=1 -race $(RACE_PKGS)

clean:
	rm -rf bin $(COVER_DIR) $(RELEASE_DIR)
