# gpupool: one non-recursive Makefile for the daemon, the client library, the CLI and the tests.
#
#   make                      build/gpupoold, build/gpupoolctl, build/libgpupool.so.1, build/libgpupool.a,
#                             build/gpupool-run and build/libgpupool-run.so
#   make run                  install missing packages, build, run gpupoold in the foreground
#   make test                 build and run the Check suites (unit and integration)
#   make test SANITIZER=address,undefined
#   make valgrind             the suites, and the daemons they start, under valgrind (make deps-valgrind installs it)
#   make fuzz                 the libFuzzer targets, FUZZ_SECONDS (60) each (needs clang)
#   make stress               32 clients for 60 s with kills, daemon restarts, hostile peers and injected faults
#                             (STRESS_CLIENTS=N STRESS_SECONDS=S STRESS_DAEMON_KILLS=N)
#   make layers               calls go down only: each directory's LAYERS against the objects' symbols
#   make check-gpu            the cuda backend's tests on this machine's GPU (skipped without one)
#   make bench                CPU benchmarks on the host backend (table + bench/results/*.json)
#   make bench-instructions   instructions per alloc+free of the allocator core (callgrind)
#   make bench-frag           fragmentation of gpupool, PyTorch-, CuPy-, no-cache policies and growth models on traces
#   make bench-replay         traces through libgpupool and a private gpupoold: round trips, imports, ns/op
#   make bench-replay-vmm     the same on cuda-vmm, whole and growing in place (GPU, or the fake driver's costs)
#   make bench-lag            traces on a fake GPU that runs behind the CPU: memory held with stream-ordered frees
#   make bench-adopt          adoption after a daemon restart next to leasing the memory anew
#   make bench-objects        attaching a named object next to loading the same bytes from the page cache
#   make bench-gpu            allocation latency: driver, driver pool, gpupool (needs a GPU)
#   make bench-pending        allocation cost with 10,000 stream-ordered frees pending (GPU or fake driver)
#   make bench-driver         each driver call of the stream-ordered path, a granule move, the capture rules (GPU or fake driver)
#   make gpu-validate         on a GPU machine: vmm-probe, check-gpu, bench-frameworks(-grow, -elastic), bench-objects, bench-gpu,
#                             bench-driver, bench-pending, replay; logs in bench/results (GPU_VALIDATE_BUDGET bounds the run)
#   make STATIC=1             link libuv, protobuf-c, jansson, inih and Check statically
#   make V=1                  show the commands
#   make deps                 install the Debian/Ubuntu packages the build needs
#   make check-deploy         the Kubernetes manifests against the API's schemas and the node's rules (offline;
#                             make deps-deploy installs the pinned schemas into build/deploy-check first)
#   make install              PREFIX (/usr/local), DESTDIR, BINDIR, SBINDIR, LIBDIR, INCLUDEDIR,
#                             SYSCONFDIR (/etc), MANDIR, SYSTEMDUNITDIR (from systemd.pc), ...
#   make uninstall            removes what make install put there

VERSION    := 0.1.0
SHELL      := /bin/bash
CC         ?= cc
PKG_CONFIG ?= pkg-config

comma := ,
ifneq ($(SANITIZER),)
B := build/san-$(subst $(comma),-,$(SANITIZER))
else
B := build
endif

ifeq ($(V),1)
Q :=
else
Q := @
endif

# Where "make install" puts things; SYSCONFDIR is also where gpupoold looks for its config.
PREFIX      ?= /usr/local
BINDIR      ?= $(PREFIX)/bin
SBINDIR     ?= $(PREFIX)/sbin
LIBDIR      ?= $(PREFIX)/lib
INCLUDEDIR  ?= $(PREFIX)/include
DATADIR     ?= $(PREFIX)/share
MANDIR      ?= $(DATADIR)/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
SYSCONFDIR  ?= /etc
systemd_var = $(or $(shell $(PKG_CONFIG) --variable=$(1) systemd 2>/dev/null),$(2))
SYSTEMDUNITDIR ?= $(call systemd_var,systemdsystemunitdir,$(PREFIX)/lib/systemd/system)
TMPFILESDIR    ?= $(call systemd_var,tmpfilesdir,$(PREFIX)/lib/tmpfiles.d)
SYSUSERSDIR    ?= $(call systemd_var,sysusersdir,$(PREFIX)/lib/sysusers.d)

WERROR ?= $(if $(CI),-Werror,)
CFLAGS ?= -O2 -g
CFLAGS += -std=gnu11 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter $(WERROR) \
          -fPIC -fvisibility=hidden -MMD -MP -DGPUPOOL_VERSION='"$(VERSION)"' -DGP_SYSCONFDIR='"$(SYSCONFDIR)"' \
          -Iinclude -Icommon -I$(B)/proto
# Each directory sees its own headers, the API's, common/'s and the messages'; the tests and
# benchmarks see every one. The library and the CLI cannot include a daemon's or a test's.
$(B)/obj/tests/%.o $(B)/obj/bench/%.o: CFLAGS += -Idaemon -Iclient -Itests
# The fake driver counts the calls of its entry points (fakecuda_calls()) by instrumenting its functions.
$(B)/obj/tests/fakecuda/%.o: CFLAGS += -finstrument-functions
LDFLAGS ?=
ifneq ($(SANITIZER),)
CFLAGS  += -fsanitize=$(SANITIZER) -fno-sanitize-recover=all -fno-omit-frame-pointer -O1
LDFLAGS += -fsanitize=$(SANITIZER)
endif

ifeq ($(STATIC),1)
LIBS_UV       := -l:libuv_a.a -lpthread -ldl -lrt
LIBS_PROTOBUF := -l:libprotobuf-c.a
LIBS_JANSSON  := -l:libjansson.a
LIBS_CHECK    := -l:libcheck.a -l:libsubunit.a -lm -lrt -lpthread
LIBS_INIH     := -l:libinih.a
else
LIBS_UV       := $(shell $(PKG_CONFIG) --libs libuv 2>/dev/null || echo -luv)
LIBS_PROTOBUF := $(shell $(PKG_CONFIG) --libs libprotobuf-c 2>/dev/null || echo -lprotobuf-c)
LIBS_JANSSON  := $(shell $(PKG_CONFIG) --libs jansson 2>/dev/null || echo -ljansson)
LIBS_CHECK    := $(shell $(PKG_CONFIG) --libs check 2>/dev/null || echo -lcheck -lsubunit -lm -lrt -lpthread)
LIBS_INIH     := $(shell $(PKG_CONFIG) --libs inih 2>/dev/null || echo -linih)
endif

PROTO_C   := $(B)/proto/gpupool.pb-c.c
PROTO_H   := $(B)/proto/gpupool.pb-c.h
COMMON    := common/conn.c common/cudadrv.c common/granule.c common/heap.c common/rbtree.c common/size.c common/wire.c
# The daemon's modules; backend_fault.c (test-only fault injection) is left out of the shipped
# gpupoold and linked into the test programs and build/tests/gpupoold-faults only.
DAEMON    := $(filter-out daemon/main.c daemon/backend_fault.c,$(wildcard daemon/*.c))
DAEMON_TEST_O := $(B)/obj/daemon/backend_fault.o
CLIENT    := $(wildcard client/*.c)
CLI       := $(wildcard cli/*.c)
TESTS     := $(wildcard tests/unit/*.c tests/integration/*.c) tests/check_main.c tests/testlib.c tests/fdstore.c

obj = $(patsubst %.c,$(B)/obj/%.o,$(1))
COMMON_O  := $(call obj,$(COMMON)) $(B)/obj/proto/gpupool.pb-c.o
DAEMON_O  := $(call obj,$(DAEMON))
CLIENT_O  := $(call obj,$(CLIENT))
CLI_O     := $(call obj,$(CLI))
TESTS_O   := $(call obj,$(sort $(TESTS)))

DAEMON_BIN := $(B)/gpupoold
CLI_BIN    := $(B)/gpupoolctl
RUN_BIN    := $(B)/gpupool-run
RUN_LIB    := $(B)/libgpupool-run.so
LIB_SO     := $(B)/libgpupool.so.1
LIB_A      := $(B)/libgpupool.a
TEST_BIN   := $(B)/tests/check_gpupool
GPU_TEST_BIN := $(B)/tests/check_gpu
BENCH_GPU  := $(B)/bench/bench_gpu
BENCH_PENDING := $(B)/bench/bench_pending
BENCH_DRIVER := $(B)/bench/bench_driver
STRESS_BIN := $(B)/tests/stress
FAULTS_BIN := $(B)/tests/gpupoold-faults
BENCH_HOST := $(B)/bench/bench_host
BENCH_FRAG := $(B)/bench/frag
BENCH_REPLAY := $(B)/bench/replay
BENCH_ADOPT := $(B)/bench/adopt
BENCH_OBJECTS := $(B)/bench/objects
BENCH_LAG  := $(B)/bench/lag
VMM_PROBE  := $(B)/bench/vmm_probe
FAKECUDA   := $(B)/tests/libfakecuda.so
# The fake as a program finds the driver (libcuda.so.1 on the library path), and programs that
# know nothing of gpupool, for gpupool-run's tests (tests/run/cuprog.c).
CUDALIB    := $(B)/tests/cudalib/libcuda.so.1
CUPROGS    := $(B)/tests/cuprog-linked $(B)/tests/cuprog-dynamic

GENERATED := $(B)/systemd/gpupoold.service $(B)/gpupool.pc

# The kubelet's plugins: Python on Debian's python3-grpcio (python/gpupool_kubelet), their
# protocols compiled at build time (proto/kubelet/, written from Kubernetes' published API), and
# a launcher that runs Debian's /usr/bin/python3 on the tree's modules, or the installed ones.
KPY           := $(B)/kubelet-py
KPY_GEN       := $(KPY)/gpupool_pb2.py $(KPY)/deviceplugin_pb2.py $(KPY)/deviceplugin_pb2_grpc.py \
                 $(KPY)/podresources_pb2.py $(KPY)/podresources_pb2_grpc.py
KPY_SRC       := $(wildcard python/gpupool_kubelet/*.py)
DEVICE_PLUGIN := $(B)/gpupool-device-plugin
PYLIBDIR      ?= $(PREFIX)/lib/gpupool/python
SYSTEM_PYTHON ?= /usr/bin/python3
GRPC_PYTHON_PLUGIN ?= /usr/bin/grpc_python_plugin
# launcher PATHS: the script that runs the device plugin on the modules under PATHS (colon-separated).
launcher = printf '%s\n' '\#!/bin/sh' \
	'\# gpupool-device-plugin: the kubelet device plugin of gpupool (docs/operations.md). It runs on' \
	'\# Debian'"'"'s $(SYSTEM_PYTHON), whose python3-grpcio and python3-protobuf it needs.' \
	'exec $(SYSTEM_PYTHON) -s -c '"'"'import sys; sys.path[:0] = sys.argv.pop(1).split(":"); from gpupool_kubelet.deviceplugin import main; sys.exit(main())'"'"' "$(1)" "$$@"' 
MAN_SRC   := $(wildcard docs/man/*.scd)
MAN_PAGES := $(patsubst docs/man/%.scd,$(B)/man/%,$(MAN_SRC))

all: $(DAEMON_BIN) $(CLI_BIN) $(LIB_SO) $(B)/libgpupool.so $(LIB_A) $(RUN_BIN) $(RUN_LIB) $(GENERATED) $(MAN_PAGES) \
	$(DEVICE_PLUGIN)

# Files that hold install paths are remade when the paths change (a stamp rewritten only then).
stamp = @mkdir -p $(B); echo '$(1)' | cmp -s - $@ || echo '$(1)' > $@
$(B)/paths.stamp: FORCE
	$(call stamp,$(PREFIX) $(BINDIR) $(SBINDIR) $(LIBDIR) $(INCLUDEDIR) $(VERSION))
$(B)/sysconfdir.stamp: FORCE
	$(call stamp,$(SYSCONFDIR))
$(B)/obj/daemon/options.o: $(B)/sysconfdir.stamp
# STATIC=1 changes only how programs link; every program links the protobuf code, so
# remaking that object when STATIC changes relinks them all.
$(B)/link.stamp: FORCE
	$(call stamp,STATIC=$(STATIC))
$(B)/obj/proto/gpupool.pb-c.o: $(B)/link.stamp

$(B)/systemd/gpupoold.service: systemd/gpupoold.service.in $(B)/paths.stamp
	@mkdir -p $(dir $@)
	$(Q)sed -e 's|@SBINDIR@|$(SBINDIR)|g; s|@BINDIR@|$(BINDIR)|g' $< > $@

$(B)/gpupool.pc: client/gpupool.pc.in $(B)/paths.stamp
	@mkdir -p $(dir $@)
	$(Q)sed -e 's|@PREFIX@|$(PREFIX)|g; s|@LIBDIR@|$(LIBDIR)|g; s|@INCLUDEDIR@|$(INCLUDEDIR)|g; s|@VERSION@|$(VERSION)|g' $< > $@

# One run of protoc for the Python modules (a grouped target).
$(KPY_GEN) &: proto/gpupool.proto proto/kubelet/deviceplugin.proto proto/kubelet/podresources.proto
	@mkdir -p $(KPY)
	@echo "  PROTOC  proto/gpupool.proto proto/kubelet/*.proto (Python)"
	$(Q)protoc -Iproto --python_out=$(KPY) proto/gpupool.proto
	$(Q)protoc -Iproto/kubelet --python_out=$(KPY) --grpc_out=$(KPY) --plugin=protoc-gen-grpc=$(GRPC_PYTHON_PLUGIN) \
		proto/kubelet/deviceplugin.proto proto/kubelet/podresources.proto

$(DEVICE_PLUGIN): $(KPY_GEN) $(KPY_SRC)
	@echo "  GEN     $@"
	$(Q)$(call launcher,$(abspath $(KPY)):$(abspath python)) > $@ && chmod 0755 $@

# Man pages: scdoc(5) sources in docs/man, e.g. gpupoold.8.scd -> gpupoold.8.
$(B)/man/%: docs/man/%.scd
	@mkdir -p $(dir $@)
	@echo "  SCDOC   $<"
	$(Q)scdoc < $< > $@

# One run of protoc-c makes both files (a grouped target): two would race under -j.
$(PROTO_C) $(PROTO_H) &: proto/gpupool.proto
	@mkdir -p $(B)/proto
	@echo "  PROTOC  $<"
	$(Q)protoc-c --c_out=$(B)/proto -Iproto $<

$(B)/obj/proto/gpupool.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

# The framework hooks may throw a C++ exception through their own frames (gpupool_torch_set_throw).
$(B)/obj/client/client_hooks.o: CFLAGS += -fexceptions

# Every object may include the generated header.
$(B)/obj/%.o: %.c $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(DAEMON_BIN): $(DAEMON_O) $(B)/obj/daemon/main.o $(COMMON_O)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_UV) $(LIBS_PROTOBUF) $(LIBS_INIH) -ldl

# The daemon with $GPUPOOL_TEST_FAULTS honoured, for the stress run: never installed.
$(B)/obj/tests/gpupoold-faults/main.o: daemon/main.c $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $< (fault injection)"
	$(Q)$(CC) $(CFLAGS) -DGPUPOOL_FAULT_INJECTION -c -o $@ $<

$(FAULTS_BIN): $(DAEMON_O) $(DAEMON_TEST_O) $(B)/obj/tests/gpupoold-faults/main.o $(COMMON_O)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_UV) $(LIBS_PROTOBUF) $(LIBS_INIH) -ldl

$(CLI_BIN): $(CLI_O) $(COMMON_O)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_PROTOBUF) $(LIBS_JANSSON)

# gpupool-run and the library it preloads (run/): the public API only; the library finds
# libgpupool.so.1 beside it ($ORIGIN), in the build tree and where both are installed.
$(RUN_BIN): $(B)/obj/run/gpupool_run.o
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -ldl -lpthread

# The preloaded library's functions (its dlsym) may be called before a sanitizer's runtime has
# started (the runtime looks up what it intercepts with dlsym): never instrumented.
$(B)/obj/run/preload.o: CFLAGS := $(filter-out -fsanitize=% -fno-sanitize-recover=all,$(CFLAGS))
$(RUN_LIB): $(B)/obj/run/preload.o $(LIB_SO)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,--no-undefined -o $@ $(B)/obj/run/preload.o -L$(B) -l:libgpupool.so.1 \
		-Wl,-rpath,'$$ORIGIN' -ldl -lpthread

$(LIB_SO): $(CLIENT_O) $(COMMON_O) client/libgpupool.map
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,libgpupool.so.1 -Wl,--version-script=client/libgpupool.map \
		-Wl,--no-undefined -Wl,-z,nodelete -o $@ $(CLIENT_O) $(COMMON_O) $(LIBS_PROTOBUF) -lpthread -ldl

$(B)/libgpupool.so: $(LIB_SO)
	$(Q)ln -sf libgpupool.so.1 $@

# One relocatable object with every hidden symbol made local, so that a program linking the
# static library sees only its API (gpupool_*), as the shared one's version script gives it.
$(LIB_A): $(CLIENT_O) $(COMMON_O)
	@echo "  AR      $@"
	$(Q)rm -f $@ $(B)/libgpupool-api.o && $(CC) $(LDFLAGS) -r -nostdlib -o $(B)/libgpupool-api.o $^ && \
		objcopy --localize-hidden $(B)/libgpupool-api.o && ar rcs $@ $(B)/libgpupool-api.o

$(TEST_BIN): $(TESTS_O) $(DAEMON_O) $(CLIENT_O) $(COMMON_O)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_CHECK) $(LIBS_UV) $(LIBS_PROTOBUF) $(LIBS_JANSSON) $(LIBS_INIH) -lpthread -ldl

# The cuda backend's tests on a real GPU: everything of the test binary but its main.
$(GPU_TEST_BIN): $(B)/obj/tests/gpu/check_gpu_main.o $(filter-out $(B)/obj/tests/check_main.o,$(TESTS_O)) $(DAEMON_O) $(CLIENT_O) $(COMMON_O)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_CHECK) $(LIBS_UV) $(LIBS_PROTOBUF) $(LIBS_JANSSON) $(LIBS_INIH) -lpthread -ldl

# The fake CUDA driver the cuda backend's tests load through $GPUPOOL_LIBCUDA.
$(FAKECUDA): $(patsubst %,$(B)/obj/tests/fakecuda/%.o,fakecuda fakecuda_ledger fakecuda_mem fakecuda_stream fakecuda_vmm) $(B)/obj/common/rbtree.o
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,libcuda.so.1 -Wl,--no-undefined -Wl,-z,nodelete -o $@ $^ -lpthread

$(CUDALIB): $(FAKECUDA)
	@mkdir -p $(dir $@)
	$(Q)ln -sf ../libfakecuda.so $@ && ln -sf ../libfakecuda.so $(dir $@)libcuda.so

$(B)/tests/cuprog-linked: tests/run/cuprog.c $(CUDALIB)
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) -DCUPROG_LINKED -o $@ $< -L$(dir $(CUDALIB)) -lcuda

$(B)/tests/cuprog-dynamic: tests/run/cuprog.c
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) -o $@ $< -ldl

# Where the CUDA toolkit is installed, check common/cudadrv.h against its cuda.h.
CUDA_INCLUDE ?= /usr/local/cuda/include
ifneq ($(wildcard $(CUDA_INCLUDE)/cuda.h),)
CUDA_ABI_OK := $(B)/tests/cuda_abi.ok
endif

$(B)/tests/cuda_abi.ok: tests/cuda_abi.c tests/cuda_abi_signatures.c common/cudadrv.h
	@mkdir -p $(dir $@)
	@echo "  CHECK   tests/cuda_abi.c and tests/cuda_abi_signatures.c against $(CUDA_INCLUDE)/cuda.h"
	$(Q)$(CC) -std=gnu11 -fsyntax-only -Icommon -I$(CUDA_INCLUDE) tests/cuda_abi.c && \
		$(CC) -std=gnu11 -fsyntax-only -Icommon -I$(CUDA_INCLUDE) tests/cuda_abi_signatures.c && touch $@

# A C++ caller of the PyTorch hook, as PyTorch is (check_hooks.c runs it).
HOOKS_THROW := $(B)/tests/hooks_throw
CXX ?= c++
$(HOOKS_THROW): tests/hooks_throw.cc include/gpupool.h $(LIB_SO)
	@mkdir -p $(dir $@)
	@echo "  CXX     $@"
	$(Q)$(CXX) -std=c++17 -O1 -g -Wall -Wextra $(WERROR) $(if $(SANITIZER),-fsanitize=$(SANITIZER)) -Iinclude \
		-o $@ $< $(LDFLAGS) -L$(B) -l:libgpupool.so.1 -Wl,-rpath,$(abspath $(B))

# The integration suites run the real daemon and CLI from $(B).
# The units (systemd-analyze verify), install into a temporary DESTDIR (a program built against
# it with pkg-config), the man pages against the programs' options and the Python package come
# first; the Check suites last, so that their summary ends the output.
test: all $(TEST_BIN) $(FAULTS_BIN) $(FAKECUDA) $(CUPROGS) $(BENCH_PENDING) $(BENCH_LAG) $(BENCH_REPLAY) $(HOOKS_THROW) $(CUDA_ABI_OK) $(B)/obj/daemon/main.o $(DAEMON_TEST_O)
	$(Q)B=$(B) tests/check-units.sh
	$(Q)B=$(B) MAKE="$(MAKE)" MAKEFLAGS= tests/check-install.sh "SANITIZER=$(SANITIZER)" "STATIC=$(STATIC)"
	$(Q)B=$(B) tests/check-man.sh
	$(Q)B=$(B) tests/check-layers-selftest.sh
	$(Q)B=$(B) tests/check-gpu-validate.sh
	$(Q)B=$(B) CC=$(CC) SANITIZER=$(SANITIZER) MAKE="$(MAKE)" MAKEFLAGS= tests/check-newcomer.sh "SANITIZER=$(SANITIZER)" "STATIC=$(STATIC)"
	$(Q)B=$(B) SANITIZER=$(SANITIZER) CC=$(CC) tests/check-python.sh
	$(Q)B=$(B) SANITIZER=$(SANITIZER) CC=$(CC) tests/check-kubelet.sh
	$(Q)GPUPOOL_BUILD_DIR=$(B) $(TEST_BIN)

# On a GPU machine: the cuda backend's tests on the real driver, then the framework hooks with
# the real PyTorch and CuPy (tests/gpu/test_frameworks_gpu.py); each skipped, saying why,
# without a GPU or the framework.
# Calls go down only: each directory's LAYERS, the objects' symbols (tests/check-layers.sh).
layers: $(DAEMON_O) $(B)/obj/daemon/main.o $(DAEMON_TEST_O) $(CLIENT_O) $(COMMON_O) $(CLI_O)
	$(Q)bash tests/check-layers.sh $(B)

check-gpu: all $(GPU_TEST_BIN)
	$(Q)GPUPOOL_BUILD_DIR=$(B) $(GPU_TEST_BIN)
	$(Q)if command -v python3 >/dev/null 2>&1; then \
		GPUPOOL_BUILD_DIR=$(B) python3 -m unittest discover -v -s tests/gpu; \
	else echo "check-gpu: the framework tests skipped: no python3"; fi

$(BENCH_GPU): $(B)/obj/bench/bench_gpu.o $(CLIENT_O) $(COMMON_O)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_PROTOBUF) -lpthread -ldl -lm

$(BENCH_PENDING): $(B)/obj/bench/bench_pending.o $(CLIENT_O) $(COMMON_O)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_PROTOBUF) -lpthread -ldl -lm

$(BENCH_DRIVER): $(B)/obj/bench/bench_driver.o $(CLIENT_O) $(COMMON_O)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_PROTOBUF) -lpthread -ldl -lm

$(BENCH_HOST): $(B)/obj/bench/bench_host.o $(DAEMON_O) $(CLIENT_O) $(COMMON_O)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_UV) $(LIBS_PROTOBUF) $(LIBS_INIH) -lpthread -ldl

# CPU benchmarks on the host backend (bench/bench_host.c): the daemon's round trip next to a
# bare SEQPACKET echo, 8 concurrent clients, the allocator core. Prints a table and writes
# JSON to bench/results/. Never part of "make test".
BENCH_ARGS_HOST ?=
bench: all $(BENCH_HOST)
	@mkdir -p bench/results
	$(Q)$(BENCH_HOST) --build $(B) --json bench/results/host-$$(date -u +%Y-%m-%d).json $(BENCH_ARGS_HOST)

$(BENCH_FRAG): $(B)/obj/bench/frag.o $(B)/obj/common/granule.o $(B)/obj/common/heap.o $(B)/obj/common/rbtree.o
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^

$(BENCH_LAG): $(B)/obj/bench/lag.o $(CLIENT_O) $(COMMON_O)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_PROTOBUF) -lpthread -ldl -lm

$(BENCH_REPLAY): $(B)/obj/bench/replay.o $(CLIENT_O) $(COMMON_O)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_PROTOBUF) -lpthread -ldl

$(BENCH_ADOPT): $(B)/obj/bench/adopt.o $(CLIENT_O) $(COMMON_O)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_PROTOBUF) -lpthread -ldl

$(BENCH_OBJECTS): $(B)/obj/bench/objects.o $(CLIENT_O) $(COMMON_O)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_PROTOBUF) -lpthread -ldl

# On a GPU machine: what the driver does with cuda-vmm memory shared as descriptors, the facts
# the cuda-vmm backend and the fake driver assume (bench/vmm_probe.c: about 5 s).
$(VMM_PROBE): $(B)/obj/bench/vmm_probe.o $(B)/obj/common/cudadrv.o
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -ldl -lpthread

# A named object attached against the same bytes loaded from the page cache (bench/objects.c;
# BENCH_OBJECTS_SIZE, 4 GiB: 3 times that of memory is used at once). On a GPU machine,
# BENCH_OBJECTS_BACKEND=cuda-vmm (or cuda) loads onto GPU 0 and attaches there.
BENCH_OBJECTS_SIZE ?= 4294967296
BENCH_OBJECTS_BACKEND ?= host
bench-objects: all $(BENCH_OBJECTS)
	@mkdir -p bench/results
	$(Q)$(BENCH_OBJECTS) --build $(B) --size $(BENCH_OBJECTS_SIZE) --backend $(BENCH_OBJECTS_BACKEND) | \
		tee bench/results/objects-$$(date -u +%Y-%m-%d)-$(BENCH_OBJECTS_BACKEND).txt

# What adoption after a daemon restart costs next to leasing the memory anew (bench/adopt.c).
bench-adopt: all $(BENCH_ADOPT)
	@mkdir -p bench/results
	$(Q)$(BENCH_ADOPT) --build $(B) | tee bench/results/adopt-$$(date -u +%Y-%m-%d).txt

# The traces the benchmarks replay: bench/traces, and the recorded PyTorch traces in
# ../shared/traces when that folder is there.
TRACES ?= $(wildcard bench/traces/*.csv ../shared/traces/*.csv)

# The traces replayed through libgpupool against a private gpupoold (bench/replay.c): round
# trips and segment imports over each trace and its second half, ns per operation, peak
# leased and in use.
bench-replay: all $(BENCH_REPLAY)
	@mkdir -p bench/results
	$(Q)$(BENCH_REPLAY) --build $(B) $(TRACES) | tee bench/results/replay-$$(date -u +%Y-%m-%d).txt

# The same traces through libgpupool on cuda-vmm, whole segments and growing in place: on the GPU
# where nvidia-smi finds one, else on the fake driver with the VMM calls' costs an H200 measured
# (its memory in /dev/shm, sparse: nothing is touched). The mean ns/op is what first touches cost.
bench-replay-vmm: all $(BENCH_REPLAY) $(FAKECUDA)
	@mkdir -p bench/results
	$(Q)out=bench/results/replay-vmm-$$(date -u +%Y-%m-%d-%H%M%S)-$$(git rev-parse --short HEAD 2>/dev/null || echo unknown); \
	if nvidia-smi -L >/dev/null 2>&1; then \
		out=$$out-gpu.txt; $(BENCH_REPLAY) --build $(B) --backend cuda-vmm $(TRACES) >$$out; st=$$?; \
	else \
		out=$$out-fake-driver.txt; dir=$$(mktemp -d -p /dev/shm gpupool-replay-fake.XXXXXX) || exit 1; \
		GPUPOOL_LIBCUDA=$$PWD/$(FAKECUDA) FAKECUDA_DIR=$$dir FAKECUDA_MEM=80G \
			$(BENCH_REPLAY) --build $(B) --backend cuda-vmm $(TRACES) >$$out; st=$$?; rm -rf "$$dir"; \
	fi; cat $$out; exit $$st

# The traces on one stream of the fake driver's GPU, running 0 to all operations behind the CPU
# (bench/lag.c): what a lagging GPU costs in memory held with stream-ordered frees.
bench-lag: all $(BENCH_LAG) $(FAKECUDA)
	@mkdir -p bench/results
	$(Q)fake=$$(mktemp -d /tmp/gpupool-fakecuda-XXXXXX); commit=$$(git rev-parse --short HEAD 2>/dev/null || echo unknown); \
		{ echo "# $$(date -u +%Y-%m-%dT%H:%M:%SZ), $$(uname -srm), $$(nproc) CPUs, commit $$commit"; \
		  GPUPOOL_LIBCUDA=$(abspath $(FAKECUDA)) FAKECUDA_DIR=$$fake FAKECUDA_MEM=64G \
		  $(BENCH_LAG) --build $(B) $(BENCH_ARGS) $(TRACES); echo $$? > $$fake/rc; } \
		| tee bench/results/lag-$$(date -u +%Y-%m-%d-%H%M%S)-$$commit.txt; \
		st=$$(cat $$fake/rc); rm -rf $$fake; exit $$st

# Instructions per alloc+free of the allocator core (callgrind; exact, unlike ns), at 1
# thousand, 100 thousand and 1 million free blocks, and per gpupool_alloc+gpupool_free pair
# served by the thread's cache (4 KiB) and by the process's own pool (64 KiB). Needs valgrind.
bench-instructions: all $(BENCH_HOST)
	$(Q)for n in 1000 100000 1000000; do \
		out=$$(mktemp); \
		valgrind --tool=callgrind --callgrind-out-file=$$out --collect-atstart=no --toggle-collect=core_loop \
			$(BENCH_HOST) --ops 10000 --core-only $$n >/dev/null 2>&1 || exit 1; \
		ir=$$(awk '/^(summary|totals):/ { print $$2 }' $$out | tail -1); \
		echo "allocator core, $$n free blocks: $$(( ir / 10000 )) instructions per alloc+free pair"; \
		rm -f $$out; \
	done
	$(Q)for size in 4096 65536; do \
		out=$$(mktemp); \
		valgrind --tool=callgrind --callgrind-out-file=$$out --collect-atstart=no --toggle-collect=client_loop \
			$(BENCH_HOST) --build $(B) --ops 10000 --client-only $$size >/dev/null 2>&1 || exit 1; \
		ir=$$(awk '/^(summary|totals):/ { print $$2 }' $$out | tail -1); \
		if [ $$size = 4096 ]; then what="4 KiB, the thread's cache"; else what="64 KiB, the process's pool"; fi; \
		echo "libgpupool, $$what: $$(( ir / 10000 )) instructions per gpupool_alloc+gpupool_free pair"; \
		rm -f $$out; \
	done

# Fragmentation: peak reserved / peak in use of gpupool's pool, the process's own pool and of
# re-implemented PyTorch, CuPy and no-cache policies over the traces (bench/frag.c).
bench-frag: $(BENCH_FRAG)
	@mkdir -p bench/results
	$(Q)$(BENCH_FRAG) $(TRACES) | tee bench/results/frag-$$(date -u +%Y-%m-%d).txt

# $(call bench_gpu_or_fake,PROGRAM,NAME): runs PROGRAM --socket S $(BENCH_ARGS) against a
# private gpupoold, on the GPU where nvidia-smi finds one, else on the fake driver, and keeps
# its output in bench/results/NAME-gpu|fakecuda-DATE-TIME-COMMIT.txt (never overwritten).
define bench_gpu_or_fake
	@mkdir -p bench/results
	$(Q)if nvidia-smi -L >/dev/null 2>&1; then lib=; gpu=gpu; else lib=$(abspath $(FAKECUDA)); gpu=fakecuda; fi; \
		fake=$$(mktemp -d /tmp/gpupool-fakecuda-XXXXXX); \
		GPUPOOL_LIBCUDA=$$lib FAKECUDA_DIR=$$fake sh bench/with-gpupoold.sh $(B) sh -c 'exec "$$0" --socket "$$GPUPOOL_SOCKET" "$$@"' $(1) $(BENCH_ARGS) \
		| tee bench/results/$(2)-$$gpu-$$(date -u +%Y-%m-%d-%H%M%S)-$$(git rev-parse --short HEAD 2>/dev/null || echo unknown).txt; \
		st=$$?; rm -rf $$fake; exit $$st
endef

# What an allocation costs with 10,000 stream-ordered frees pending (bench/bench_pending.c):
# on the GPU where nvidia-smi finds one, else on the fake driver. Writes bench/results/.
bench-pending: all $(BENCH_PENDING) $(FAKECUDA)
	$(call bench_gpu_or_fake,$(BENCH_PENDING),pending)

# What each driver call on the stream-ordered path costs, what a granule move costs on cuda-vmm,
# and what a graph capture forbids (bench/bench_driver.c), on the GPU where nvidia-smi finds
# one, else on the fake driver.
bench-driver: all $(BENCH_DRIVER) $(FAKECUDA)
	$(call bench_gpu_or_fake,$(BENCH_DRIVER),driver)

# Everything gpu-validate runs, built (with STATIC=1 to carry it to a machine without the libraries).
gpu-tools: all $(GPU_TEST_BIN) $(BENCH_GPU) $(BENCH_PENDING) $(BENCH_DRIVER) $(BENCH_OBJECTS) $(VMM_PROBE) $(BENCH_REPLAY)

# On a GPU machine: the driver's answers (vmm-probe), check-gpu, bench-frameworks with its
# throughput with GPUPOOL_SEGMENTS=grow on cuda-vmm and its elasticity, bench-objects,
# bench-gpu, bench-driver, bench-pending and the traces replayed on both cuda backends, against
# build/ as it is (bench/gpu-validate.sh builds nothing), one log per part in bench/results/,
# named by the run's time, commit and GPU (never overwritten); GPU_VALIDATE_PARTS="check-gpu
# bench-gpu" runs some, GPU_VALIDATE_BUDGET=SECONDS stops the run in time to write its logs.
gpu-validate:
	$(Q)sh bench/gpu-validate.sh $(B)

# On a GPU machine: allocation latency of the driver, its stream-ordered pool and gpupool,
# and the cost of importing a segment (bench/bench_gpu.c). BENCH_ARGS="--ops 100000" etc.
bench-gpu: all $(BENCH_GPU)
	$(Q)sh bench/bench-gpu.sh $(B) $(BENCH_ARGS)

# On a GPU machine with PyTorch: training throughput of two processes at once with PyTorch's
# allocator (twice: the native/native spread) and with gpupool, then elasticity (two processes
# whose peaks together exceed the GPU), against a gpupoold with the cuda backend
# (bench/frameworks). The log goes to bench/results/frameworks-DATE-TIME-COMMIT.txt.
# BENCH_ARGS_TORCH="--reps 3 --models transformer --allocators gpupool,gpupool-mempool" etc.
BENCH_ARGS_TORCH ?=
BENCH_ARGS_ELASTIC ?=
bench-frameworks: all
	@mkdir -p bench/results
	$(Q)log=bench/results/frameworks-$$(date -u +%Y-%m-%d-%H%M%S)-$$(git rev-parse --short HEAD 2>/dev/null || echo unknown).txt; \
	{ sh bench/with-gpupoold.sh $(B) python3 bench/frameworks/torch_alloc.py && \
	  sh bench/with-gpupoold.sh $(B) python3 bench/frameworks/torch_throughput.py $(BENCH_ARGS_TORCH) && \
	  sh bench/with-gpupoold.sh $(B) python3 bench/frameworks/torch_elastic.py $(BENCH_ARGS_ELASTIC); \
	  echo $$? > $$log.rc; } 2>&1 | tee $$log; \
	rc=$$(cat $$log.rc); rm -f $$log.rc; echo "bench-frameworks: the log is $$log"; exit $$rc

$(STRESS_BIN): $(B)/obj/tests/stress/stress.o $(B)/obj/tests/fdstore.o $(CLIENT_O) $(COMMON_O)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_PROTOBUF) -lpthread -ldl

# Many clients, SIGKILLs, hostile peers and injected backend faults against one daemon, with
# its invariants checked throughout and every byte accounted for at the end (tests/stress).
STRESS_CLIENTS ?= 32
STRESS_SECONDS ?= 60
STRESS_DAEMON_KILLS ?= 4
# The daemon's RSS bound in MiB; ASan's shadow memory and quarantine need more.
STRESS_MAX_RSS ?= $(if $(SANITIZER),256,64)
stress: all $(STRESS_BIN) $(FAULTS_BIN)
	$(Q)$(STRESS_BIN) --build $(B) --clients $(STRESS_CLIENTS) --seconds $(STRESS_SECONDS) --max-rss $(STRESS_MAX_RSS) \
		--daemon-kills $(STRESS_DAEMON_KILLS)

# Fuzzing (libFuzzer, clang, with ASan and UBSan): the protocol as one client's packets reach
# the daemon, and the allocator core against a reference model. Each target runs for
# FUZZ_SECONDS from the seed corpus in tests/fuzz/corpus (copied: new finds stay in build/).
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FB           := build/fuzz
FUZZ_FLAGS   := -g -O1 -std=gnu11 -MMD -MP -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all \
                -DGPUPOOL_VERSION='"$(VERSION)"' -Iinclude -Icommon -Idaemon -Itests -I$(B)/proto
FUZZ_SRC     := $(DAEMON) $(COMMON) $(PROTO_C)
FUZZ_TARGETS := $(FB)/fuzz_protocol $(FB)/fuzz_pool $(FB)/fuzz_identity $(FB)/fuzz_users

$(FB)/obj/%.o: %.c $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  FUZZCC  $<"
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) -c -o $@ $<

$(FB)/obj/proto/gpupool.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	@echo "  FUZZCC  $<"
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) -c -o $@ $<

$(FB)/fuzz_%: $(FB)/obj/tests/fuzz/fuzz_%.o $(patsubst %.c,$(FB)/obj/%.o,$(DAEMON) $(COMMON)) $(FB)/obj/proto/gpupool.pb-c.o
	@echo "  LD      $@"
	$(Q)$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -o $@ $^ $(LIBS_UV) $(LIBS_PROTOBUF) $(LIBS_INIH) -ldl -lpthread

fuzz: $(FUZZ_TARGETS)
	$(Q)for t in protocol pool identity users; do \
		mkdir -p $(FB)/corpus/$$t && cp -n tests/fuzz/corpus/$$t/* $(FB)/corpus/$$t/ 2>/dev/null; \
		echo "fuzz_$$t: $(FUZZ_SECONDS) s"; \
		$(FB)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -print_final_stats=1 \
			-artifact_prefix=$(FB)/crash-$$t- $(FB)/corpus/$$t 2>&1 | \
			grep -E "^(#[0-9]+ +DONE|Done|stat::number_of_executed_units|stat::average_exec_per_sec|==[0-9]+==ERROR|SUMMARY|fuzz_pool:|INFO: seed corpus)" ; \
		test $${PIPESTATUS[0]} -eq 0 || exit 1; \
	done

# A long campaign that grows the committed corpus (tests/fuzz/campaign.sh; not in CI): FUZZ_RUNS
# inputs per target (of up to FUZZ_MAX_LEN bytes) over FUZZ_JOBS processes, merged back into
# tests/fuzz/corpus.
FUZZ_RUNS ?= 10000000
FUZZ_JOBS ?= 2
FUZZ_MAX_LEN ?= 8192
fuzz-campaign: $(FUZZ_TARGETS)
	$(Q)FB=$(FB) RUNS=$(FUZZ_RUNS) JOBS=$(FUZZ_JOBS) MAX_LEN=$(FUZZ_MAX_LEN) tests/fuzz/campaign.sh \
		$(or $(FUZZ_ONLY),protocol pool identity users)

# Writes the protocol fuzzer's seed corpus (committed; run again when the protocol grows).
fuzz-seeds: $(B)/tests/make_seeds
	$(Q)$(B)/tests/make_seeds tests/fuzz/corpus/protocol

$(B)/tests/make_seeds: $(B)/obj/tests/fuzz/make_seeds.o $(COMMON_O)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_PROTOBUF) -ldl

# The suites under valgrind, the daemons they start too. Slow (minutes); not part of "make test".
# --vgdb=no: no gdbserver file per process in /tmp, which a process killed by a signal leaves
# behind and which a later daemon run as another uid with the same pid cannot replace (it then
# exits at start).
VALGRIND := valgrind -q --vgdb=no --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite --show-leak-kinds=definite
valgrind: all $(TEST_BIN) $(FAULTS_BIN) $(FAKECUDA) $(CUPROGS) $(HOOKS_THROW)
	$(Q)GPUPOOL_BUILD_DIR=$(B) GPUPOOL_DAEMON_WRAPPER="$(VALGRIND)" GPUPOOL_TEST_VALGRIND=1 CK_DEFAULT_TIMEOUT=120 CK_TIMEOUT_MULTIPLIER=5 \
		$(VALGRIND) $(TEST_BIN)

DEBS := gcc g++ make pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler check libsubunit-dev libjansson-dev libinih-dev \
        scdoc systemd python3 python3-venv python3-grpcio python3-protobuf protobuf-compiler protobuf-compiler-grpc

# Another apt or dpkg (unattended upgrades at a fresh machine's boot) may hold the lock: wait.
APT_LOCK_WAIT := 600

deps:
	@missing=""; for p in $(DEBS); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		command -v apt-get >/dev/null || { echo "missing packages:$$missing (install them, then run make again)"; exit 1; }; \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		echo "installing:$$missing"; \
		echo "(where another apt or dpkg holds its lock, unattended upgrades at boot say, this waits for it, up to $(APT_LOCK_WAIT) s)"; \
		$$sudo apt-get -o DPkg::Lock::Timeout=$(APT_LOCK_WAIT) update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=$(APT_LOCK_WAIT) install -y -qq \
			--no-install-recommends $$missing; \
	fi

# "make" and "make test" without the build's packages say what to run, before a compiler fails
# on a missing header ("make run" installs them itself). Not Debian (no dpkg-query): not checked.
ifneq ($(filter-out all test,$(or $(MAKECMDGOALS),all)),$(or $(MAKECMDGOALS),all))
DEPS_MISSING := $(shell command -v dpkg-query >/dev/null 2>&1 && for p in $(DEBS); do \
	dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || printf ' %s' $$p; done)
ifneq ($(strip $(DEPS_MISSING)),)
$(error the build needs packages that are not installed:$(DEPS_MISSING). Run "make deps" first (it installs them with apt-get), or "make run", which does)
endif
endif

# What "make valgrind" needs beyond the build.
deps-valgrind:
	$(Q)$(MAKE) --no-print-directory deps DEBS="valgrind"

# What "make fuzz" needs beyond the build (Debian 12's clang is 14).
FUZZ_DEBS := clang libclang-rt-14-dev

deps-fuzz:
	$(Q)$(MAKE) --no-print-directory deps DEBS="$(FUZZ_DEBS)"

# make check-deploy validates deploy/kubernetes offline, against the schemas of the npm packages
# pinned in deploy/check/package.json, which deps-deploy installs (Node.js and npm from Debian
# where missing) into $(DEPLOY_CHECK); no network at check time.
DEPLOY_CHECK := build/deploy-check
DEPLOY_DEBS  := nodejs npm

$(DEPLOY_CHECK)/node_modules/.installed: deploy/check/package.json
	$(Q)command -v npm >/dev/null || $(MAKE) --no-print-directory deps DEBS="$(DEPLOY_DEBS)"
	@mkdir -p $(DEPLOY_CHECK)
	@echo "  NPM     $(DEPLOY_CHECK) (deploy/check/package.json)"
	$(Q)cp deploy/check/package.json $(DEPLOY_CHECK)/ && cd $(DEPLOY_CHECK) && \
		npm install --no-audit --no-fund --no-package-lock --silent >/dev/null
	@touch $@

deps-deploy: $(DEPLOY_CHECK)/node_modules/.installed

check-deploy: $(DEPLOY_CHECK)/node_modules/.installed
	$(Q)tests/check-deploy.sh $(DEPLOY_CHECK)/node_modules

RUN_SOCKET ?= $(CURDIR)/build/gpupool.sock

run: deps
	$(Q)$(MAKE) --no-print-directory all
	@echo "gpupoold: socket $(RUN_SOCKET)  (export GPUPOOL_SOCKET=$(RUN_SOCKET); Ctrl-C stops it)"
	$(Q)$(B)/gpupoold --socket $(RUN_SOCKET) --backend auto

INSTALL ?= install

install: all
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SBINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) \
		$(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(SYSTEMDUNITDIR) $(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(SYSUSERSDIR) \
		$(DESTDIR)$(SYSCONFDIR)/gpupool $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man3 \
		$(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8
	$(INSTALL) -m 0755 $(DAEMON_BIN) $(DESTDIR)$(SBINDIR)/gpupoold
	$(INSTALL) -m 0755 $(CLI_BIN) $(DESTDIR)$(BINDIR)/gpupoolctl
	$(INSTALL) -m 0755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/libgpupool.so.$(VERSION)
	ln -sf libgpupool.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libgpupool.so.1
	ln -sf libgpupool.so.1 $(DESTDIR)$(LIBDIR)/libgpupool.so
	$(INSTALL) -m 0644 $(LIB_A) $(DESTDIR)$(LIBDIR)/libgpupool.a
	$(INSTALL) -m 0755 $(RUN_BIN) $(DESTDIR)$(BINDIR)/gpupool-run
	$(INSTALL) -m 0755 $(RUN_LIB) $(DESTDIR)$(LIBDIR)/libgpupool-run.so
	$(INSTALL) -m 0644 include/gpupool.h $(DESTDIR)$(INCLUDEDIR)/gpupool.h
	$(INSTALL) -m 0644 $(B)/gpupool.pc $(DESTDIR)$(PKGCONFIGDIR)/gpupool.pc
	$(INSTALL) -m 0644 $(B)/systemd/gpupoold.service systemd/gpupoold.socket $(DESTDIR)$(SYSTEMDUNITDIR)/
	$(INSTALL) -m 0644 systemd/gpupool.tmpfiles $(DESTDIR)$(TMPFILESDIR)/gpupool.conf
	$(INSTALL) -m 0644 systemd/gpupool.sysusers $(DESTDIR)$(SYSUSERSDIR)/gpupool.conf
	$(INSTALL) -m 0644 systemd/gpupoold.conf.example $(DESTDIR)$(SYSCONFDIR)/gpupool/gpupoold.conf.example
	$(INSTALL) -d $(DESTDIR)$(PYLIBDIR)/gpupool_kubelet
	$(INSTALL) -m 0644 $(KPY_GEN) $(DESTDIR)$(PYLIBDIR)/
	$(INSTALL) -m 0644 $(KPY_SRC) $(DESTDIR)$(PYLIBDIR)/gpupool_kubelet/
	$(call launcher,$(PYLIBDIR)) > $(DESTDIR)$(BINDIR)/gpupool-device-plugin
	chmod 0755 $(DESTDIR)$(BINDIR)/gpupool-device-plugin
	for m in $(MAN_PAGES); do \
		$(INSTALL) -m 0644 $$m $(DESTDIR)$(MANDIR)/man$${m##*.}/ || exit 1; \
	done

uninstall:
	rm -f $(DESTDIR)$(SBINDIR)/gpupoold $(DESTDIR)$(BINDIR)/gpupoolctl \
		$(DESTDIR)$(LIBDIR)/libgpupool.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libgpupool.so.1 \
		$(DESTDIR)$(LIBDIR)/libgpupool.so $(DESTDIR)$(LIBDIR)/libgpupool.a $(DESTDIR)$(INCLUDEDIR)/gpupool.h \
		$(DESTDIR)$(BINDIR)/gpupool-run $(DESTDIR)$(LIBDIR)/libgpupool-run.so \
		$(DESTDIR)$(PKGCONFIGDIR)/gpupool.pc $(DESTDIR)$(SYSTEMDUNITDIR)/gpupoold.service \
		$(DESTDIR)$(SYSTEMDUNITDIR)/gpupoold.socket $(DESTDIR)$(TMPFILESDIR)/gpupool.conf \
		$(DESTDIR)$(SYSUSERSDIR)/gpupool.conf $(DESTDIR)$(SYSCONFDIR)/gpupool/gpupoold.conf.example \
		$(DESTDIR)$(BINDIR)/gpupool-device-plugin
	rm -rf $(DESTDIR)$(PYLIBDIR)
	-rmdir $(DESTDIR)$(PREFIX)/lib/gpupool 2>/dev/null
	for m in $(MAN_PAGES); do p=$${m##*/}; rm -f $(DESTDIR)$(MANDIR)/man$${p##*.}/$$p; done
	-rmdir $(DESTDIR)$(SYSCONFDIR)/gpupool 2>/dev/null

clean:
	rm -rf build

FORCE:

.PHONY: FORCE all install uninstall test layers bench-objects check-gpu gpu-tools gpu-validate bench-gpu bench-pending bench-driver bench-frameworks stress fuzz fuzz-campaign fuzz-seeds bench bench-frag bench-replay bench-replay-vmm bench-lag bench-adopt bench-instructions valgrind deps deps-fuzz deps-valgrind deps-deploy check-deploy run clean

.SECONDARY:

-include $(shell find $(B)/obj -name '*.d' 2>/dev/null)
-include $(shell find $(FB)/obj -name '*.d' 2>/dev/null)
