# flowkv: one Makefile for the whole tree. Read top to bottom:
#   1. settings   2. sources per module   3. build rules
#   4. test, sanitizers, lint   5. install, clean
# Every library comes from pkg-config; `make deps` installs the Debian
# packages that provide them. Outputs go to $(BUILD) (build/ by default):
# programs in build/bin, libraries in build/lib, tests in build/tests.

# ---- 1. settings -----------------------------------------------------------
PREFIX  ?= /usr/local
DESTDIR ?=
BUILD   ?= build
# SAN=address|undefined|thread builds everything with that sanitizer.
SAN     ?=
# Seconds a single test program may run before it counts as failed.
TEST_TIMEOUT ?= 900

PKGS := libuv libxxhash lmdb libibverbs librdmacm inih libsodium libcurl
# Recursive (=) on purpose: pkg-config runs only when a recipe needs it, so
# `make deps` works on a machine that lacks the packages.
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS))
PKG_LIBS   = $(shell pkg-config --libs $(PKGS))

WARN   := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
          -Wvla -Wformat=2 -Wundef -Wpointer-arith -Wno-unused-parameter
CFLAGS ?= -O2 -g
ALL_CFLAGS = -std=gnu11 $(WARN) $(CFLAGS) -pthread -fno-common -D_GNU_SOURCE -MMD -MP \
             $(PKG_CFLAGS) $(SAN_FLAGS)
LDLIBS  = $(PKG_LIBS) -lm -pthread

ifneq ($(SAN),)
SAN_FLAGS := -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all
endif
# FUZZ=1 (with CC=clang) instruments every object for libFuzzer's coverage.
ifeq ($(FUZZ),1)
SAN_FLAGS += -fsanitize=fuzzer-no-link
endif

# ---- 2. sources per module -------------------------------------------------
# Each module is a static library. Include paths are per module so that the
# layering in DESIGN.md is enforced by the compiler: consensus/ cannot see
# flows/ headers, flows/ cannot see consensus/.
COMMON_SRC    := $(wildcard common/*.c)
FLOWS_SRC     := $(wildcard flows/*.c flows/fabric/*.c)
CONSENSUS_SRC := $(wildcard consensus/*.c)
# server/: everything but the program's main() goes into libfkserver.a so
# tests can link the pieces.
SERVER_SRC    := $(filter-out server/main.c,$(wildcard server/*.c))
# ycsb/: the YCSB core (generators, workload, report); its program's main()
# lives in ycsb/cmd/ (section 3b).
YCSB_SRC      := $(wildcard ycsb/*.c)
# client/: libflowkv (the CLI's main() lives in client/cmd/).
CLIENT_SRC    := $(wildcard client/*.c)

LIB_COMMON    := $(BUILD)/lib/libfkcommon.a
LIB_FLOWS     := $(BUILD)/lib/libflows.a
LIB_CONSENSUS := $(BUILD)/lib/libconsensus.a
LIB_SERVER    := $(BUILD)/lib/libfkserver.a
LIB_YCSB      := $(BUILD)/lib/libycsb.a
LIB_CLIENT    := $(BUILD)/lib/libfkclient.a
LIBS := $(LIB_COMMON)
ifneq ($(FLOWS_SRC),)
LIBS := $(LIB_FLOWS) $(LIBS)
endif
ifneq ($(CONSENSUS_SRC),)
LIBS := $(LIB_CONSENSUS) $(LIBS)
endif
ifneq ($(CLIENT_SRC),)
LIBS := $(LIB_CLIENT) $(LIBS)
endif
ifneq ($(SERVER_SRC),)
LIBS := $(LIB_SERVER) $(LIBS)
endif
ifneq ($(YCSB_SRC),)
LIBS := $(LIB_YCSB) $(LIBS)
endif

INC_common    := -Icommon
INC_flows     := -Icommon -Iflows -Iflows/fabric
INC_consensus := -Icommon -Iconsensus
INC_server    := -Icommon -Iconsensus -Iflows -Iflows/fabric -Iproto -Iserver
INC_ycsb      := -Icommon -Iycsb -Iclient -I$(BUILD)/gen
INC_client    := -Icommon -Iconsensus -Iflows -Iflows/fabric -Iproto -Iclient
INC_tests     := -Icommon -Iflows -Iflows/fabric -Iconsensus -Iproto -Iserver -Iycsb -Iclient -Itests

UNIT_TESTS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(wildcard tests/unit/test_*.c))
# Shell tests (integration, cluster, VM) print the same summary as C tests.
SHELL_TESTS := $(sort $(wildcard tests/integration/test_*.sh))

# V=1 prints every command; by default one short line per file.
ifeq ($(V),1)
Q :=
else
Q := @
endif

# Keep objects of test programs (make would delete them as intermediates).
.SECONDARY:

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

.PHONY: all deps deps-build run test test-run tests asan ubsan tsan lint format install clean
.DEFAULT_GOAL := all

all: $(LIBS)

# ---- 3. build rules --------------------------------------------------------
$(BUILD)/obj/common/%.o: INCS = $(INC_common)
$(BUILD)/obj/flows/%.o: INCS = $(INC_flows)
$(BUILD)/obj/consensus/%.o: INCS = $(INC_consensus)
$(BUILD)/obj/server/%.o: INCS = $(INC_server)
$(BUILD)/obj/ycsb/%.o: INCS = $(INC_ycsb)
$(BUILD)/obj/client/%.o: INCS = $(INC_client)
$(BUILD)/obj/tests/%.o: INCS = $(INC_tests)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	@echo "  CC      $<"
	$(Q)$(CC) $(ALL_CFLAGS) $(INCS) -c $< -o $@

$(LIB_COMMON): $(call obj,$(COMMON_SRC))
$(LIB_FLOWS): $(call obj,$(FLOWS_SRC))
$(LIB_CONSENSUS): $(call obj,$(CONSENSUS_SRC))
$(LIB_SERVER): $(call obj,$(SERVER_SRC))
$(LIB_YCSB): $(call obj,$(YCSB_SRC))
$(LIB_CLIENT): $(call obj,$(CLIENT_SRC))
$(BUILD)/lib/%.a:
	@mkdir -p $(@D)
	@echo "  AR      $@"
	$(Q)rm -f $@ && $(AR) rcs $@ $^

# Every unit test links the harness (tests/check.c) and the protocol cores'
# fixture (tests/core_fix.c, used by the core tests).
TEST_OBJS := $(BUILD)/obj/tests/check.o $(BUILD)/obj/tests/core_fix.o
$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(TEST_OBJS) $(LIBS)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ $< $(TEST_OBJS) $(LIBS) $(LDLIBS)

# Helper programs that tests run (not tests themselves).
AUX_PROGS := $(patsubst tests/selftest/%.c,$(BUILD)/tests-aux/%,$(wildcard tests/selftest/*.c))
$(BUILD)/tests-aux/%: $(BUILD)/obj/tests/selftest/%.o $(BUILD)/obj/tests/check.o $(LIBS)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/obj/tests/check.o $(LIBS) $(LDLIBS)
# kv_history (issue 8) checks its histories with lin.c, so it links
# libfksim.a too: $(LIB_SIM), spelled out in the prerequisites because that
# variable is set in section 3c below and a prerequisite list is expanded
# when make reads it.
$(BUILD)/tests-aux/kv_history: $(BUILD)/obj/tests/cluster/kv_history.o $(BUILD)/lib/libfksim.a $(LIBS)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ $< $(LIB_SIM) $(LIBS) $(LDLIBS)
# Clients the cluster tests run (tests/cluster/*.c -> build/tests-aux/).
AUX_PROGS += $(patsubst tests/cluster/%.c,$(BUILD)/tests-aux/%,$(wildcard tests/cluster/*.c))
$(BUILD)/tests-aux/%: $(BUILD)/obj/tests/cluster/%.o $(LIBS)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBS) $(LDLIBS)

tests: $(UNIT_TESTS) $(AUX_PROGS)

# ---- 3a. ycsb: etcd's gRPC messages (ycsb/etcd/etcd_kv.proto) ---------------
# protoc-c turns the proto into C (build/gen), compiled into libycsb.a with
# the compiler's default warnings (generated code, not ours). Only the
# programs that link the etcd bindings (flowkv-ycsb, the ycsb tests) link
# gRPC and protobuf-c (-db etcd) and jansson (-db etcd-json).
GRPC_PKGS  := grpc libprotobuf-c jansson
GRPC_CFLAGS = $(shell pkg-config --cflags $(GRPC_PKGS))
GRPC_LIBS   = $(shell pkg-config --libs $(GRPC_PKGS))
ETCD_PB_C := $(BUILD)/gen/etcd_kv.pb-c.c
ETCD_PB_H := $(BUILD)/gen/etcd_kv.pb-c.h
$(ETCD_PB_C) $(ETCD_PB_H) &: ycsb/etcd/etcd_kv.proto
	@mkdir -p $(@D)
	@echo "  PROTOC  $<"
	$(Q)protoc-c --c_out=$(BUILD)/gen --proto_path=ycsb/etcd $<
$(BUILD)/obj/gen/etcd_kv.pb-c.o: $(ETCD_PB_C)
	@mkdir -p $(@D)
	@echo "  CC      $<"
	$(Q)$(CC) -std=gnu11 $(CFLAGS) $(SAN_FLAGS) $(GRPC_CFLAGS) -I$(BUILD)/gen -c $< -o $@
$(LIB_YCSB): $(BUILD)/obj/gen/etcd_kv.pb-c.o
$(BUILD)/obj/ycsb/ycsb_etcd_grpc.o: $(ETCD_PB_H)
$(BUILD)/obj/ycsb/%.o: INCS += $(GRPC_CFLAGS)
$(BUILD)/obj/tests/unit/test_ycsb_%.o: INCS += -I$(BUILD)/gen $(GRPC_CFLAGS)
$(BUILD)/obj/tests/unit/test_ycsb_%.o: $(ETCD_PB_H)
$(BUILD)/tests/test_ycsb_%: LDLIBS += $(GRPC_LIBS)

# ---- 3b. ycsb: flowkv-ycsb (issue 7) --------------------------------------
# build/bin/flowkv-ycsb from ycsb/cmd/flowkv_ycsb.c, libycsb.a and, for its
# flowkv binding, libflowkv and the layers under it ($(LIBS)).
YCSB_PROG := $(BUILD)/bin/flowkv-ycsb
$(YCSB_PROG): LDLIBS += $(GRPC_LIBS)
$(YCSB_PROG): $(BUILD)/obj/ycsb/cmd/flowkv_ycsb.o $(LIBS)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBS) $(LDLIBS)
all: $(YCSB_PROG)
tests: $(YCSB_PROG)
# `make bench`: the DFI paper's replication benchmark (ycsb/bench/bench.sh):
# YCSB-B with one 64-byte field against fresh local NOPaxos and Multi-Paxos
# clusters (3 and 5 replicas, TCP fabric) and a 3-member etcd cluster (the
# baseline, same run); writes build/bench/results.csv and
# p95-vs-throughput.png, ends with `bench: flowkv_nopaxos_peak=...`.
.PHONY: bench
bench: deps
	@$(MAKE) --no-print-directory all
	@timeout --kill-after=30 1200 ycsb/bench/bench.sh -o build/bench

# ---- 3d. server: flowkv-server (issue 6) -----------------------------------
SERVER_PROG := $(BUILD)/bin/flowkv-server
$(SERVER_PROG): $(BUILD)/obj/server/main.o $(LIBS)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBS) $(LDLIBS)
all: $(SERVER_PROG)
tests: $(SERVER_PROG)
# the flowkv CLI (client/cmd/flowkv_cli.c)
CLI_PROG := $(BUILD)/bin/flowkv
$(CLI_PROG): $(BUILD)/obj/client/cmd/flowkv_cli.o $(BUILD)/obj/client/cmd/cli_snap.o $(LIBS)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ $(filter %.o,$^) $(LIBS) $(LDLIBS)
all: $(CLI_PROG)
tests: $(CLI_PROG)

# `make bench-kv`: single-client put and get latency on fresh 3-replica
# clusters of each protocol and durability, against a raw TCP round trip
# in the same run (client/bench/bench-kv.sh, client/bench/kv_lat.c).
BENCH_LAT := $(BUILD)/bin/flowkv-bench-lat
$(BENCH_LAT): $(BUILD)/obj/client/bench/kv_lat.o $(LIBS)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBS) $(LDLIBS)
tests: $(BENCH_LAT)
.PHONY: bench-kv
bench-kv: deps
	@$(MAKE) --no-print-directory all $(BENCH_LAT)
	@timeout --kill-after=30 900 client/bench/bench-kv.sh $(abspath $(BUILD))

# `make bench-capacity`: both protocols and etcd at a million YCSB default
# records: load, workloads A to F with their p95, a replica's memory,
# restart time against a 1,000-record replica, catch-up of a wiped
# follower against mdb_copy, sync durability, and 64-byte records at a
# million against 5,000 (ycsb/bench/capacity.sh, whose -p and -s pick
# protocols and stages; about 50 minutes, 20 of them loading NOPaxos in
# sync durability, 10 GB of disk at most at once).
# Ends with `capacity: load_ratio_etcd=...` (NOPaxos' figures as nop_...).
.PHONY: bench-capacity
bench-capacity: deps
	@$(MAKE) --no-print-directory all
	@timeout --kill-after=30 3600 ycsb/bench/capacity.sh -o $(abspath $(BUILD))/bench-capacity

# `make bench-clients`: YCSB-B (the default record, 100,000 records) at 1,
# 16, 64, 256 and 1,024 client handles (threads of one flowkv-ycsb, one
# request in flight each) on 3 replicas of each protocol and on etcd
# through gRPC, against one handle with 128 in flight; ops/s, read p95 and
# a replica's RSS at each count (ycsb/bench/clients.sh; about 6 minutes).
# Ends with `clients: handles=1024 ops_ratio_peak=X rss_mib=Y etcd_ratio_min=Z`.
.PHONY: bench-clients
bench-clients: deps
	@$(MAKE) --no-print-directory all
	@timeout --kill-after=30 1800 ycsb/bench/clients.sh -o $(abspath $(BUILD))/bench-clients

# `make bench-member`: the time to add a replica to a Multi-Paxos cluster
# holding 1,000,000 default records (about 1 GiB), against mdb_copy of the
# same data, and YCSB-B through a member's removal and return
# (ycsb/bench/member.sh); ends with a `member:` line. About 5 minutes.
.PHONY: bench-member
bench-member: deps
	@$(MAKE) --no-print-directory all
	@timeout --kill-after=30 1800 ycsb/bench/member.sh -o $(abspath $(BUILD))/bench-member

# ---- 3c. consensus simulator (issue 5) -------------------------------------
# consensus/sim/*.c but main.c -> libfksim.a (the simulator and the
# linearizability checker), linked into build/bin/flowkv-sim and into the
# test_sim_* / test_lin_* unit tests. `make sim` runs a campaign:
#   make sim                 $(SEEDS) seeds (default 1000)
#   make sim SEEDS=100000    a long campaign
#   make sim SEED=1234       replays one seed exactly (SIM_ARGS=--verbose for more)
SIM_SRC  := $(filter-out consensus/sim/main.c,$(wildcard consensus/sim/*.c))
LIB_SIM  := $(BUILD)/lib/libfksim.a
SIM_PROG := $(BUILD)/bin/flowkv-sim
SEEDS    ?= 1000
$(LIB_SIM): $(call obj,$(SIM_SRC))
$(SIM_PROG): $(BUILD)/obj/consensus/sim/main.o $(LIB_SIM) $(LIB_CONSENSUS) $(LIB_COMMON)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ $< $(LIB_SIM) $(LIB_CONSENSUS) $(LIB_COMMON) $(LDLIBS)
$(BUILD)/tests/test_sim_%: $(BUILD)/obj/tests/unit/test_sim_%.o $(BUILD)/obj/tests/check.o $(LIB_SIM) $(LIBS)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/obj/tests/check.o $(LIB_SIM) $(LIBS) $(LDLIBS)
$(BUILD)/tests/test_lin_%: $(BUILD)/obj/tests/unit/test_lin_%.o $(BUILD)/obj/tests/check.o $(LIB_SIM) $(LIBS)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/obj/tests/check.o $(LIB_SIM) $(LIBS) $(LDLIBS)
all: $(SIM_PROG)
tests: $(SIM_PROG)
.PHONY: sim sim-long
sim: $(SIM_PROG)
	$(SIM_PROG) $(if $(SEED),--seed $(SEED),--seeds $(SEEDS)) $(SIM_ARGS)
# The long campaign (tests/sim-long.sh): 200,000 seeds of each protocol and
# 50,000 of durable NOPaxos, one shard per core, with progress lines and a
# one-line summary; about 25 minutes on two cores.
sim-long: $(SIM_PROG)
	@BUILD=$(BUILD) tests/sim-long.sh

-include $(shell find $(BUILD)/obj $(BUILD)/pic -name '*.d' 2>/dev/null)

# ---- 4. dependencies, run, tests, sanitizers, lint -------------------------
# `make run` starts a local cluster once flowkv-server exists (the server
# issue); until then it says so and fails rather than pretending.
# A local cluster in the foreground (deploy/run-local.sh): installs what is
# missing, builds, then runs. `make run PROTOCOL=multipaxos REPLICAS=5`.
PROTOCOL ?= nopaxos
REPLICAS ?= 3
run: deps-build all
	@deploy/run-local.sh -p $(PROTOCOL) -n $(REPLICAS)

# Installs missing Debian packages (root or sudo), else prints the command.
deps:
	@deploy/deps.sh all
# What building and `make run` need alone (no test or benchmark tools).
deps-build:
	@deploy/deps.sh build

# `make test` = deps, then build and run every test; the last line printed is
# "N passed, M failed" and the status is non-zero if M > 0 or N = 0.
test: deps
	@$(MAKE) --no-print-directory test-run

test-run: all tests
	@BUILD=$(BUILD) SAN=$(SAN) TEST_LOG_DIR=$(BUILD)/test-logs tests/run.sh -t $(TEST_TIMEOUT) $(UNIT_TESTS) $(SHELL_TESTS)

# The same tests under each sanitizer, in separate build trees.
asan: deps
	@$(MAKE) --no-print-directory BUILD=build/asan SAN=address test-run
ubsan: deps
	@$(MAKE) --no-print-directory BUILD=build/ubsan SAN=undefined test-run
tsan: deps
	@$(MAKE) --no-print-directory BUILD=build/tsan SAN=thread test-run

C_FILES := $(sort $(shell find common flows consensus proto server client ycsb tests -name '*.[ch]' 2>/dev/null))
lint:
	clang-format --dry-run --Werror $(C_FILES)
	cppcheck --quiet --error-exitcode=1 --std=c11 --enable=warning,performance,portability \
	    --inline-suppr --suppress=missingIncludeSystem -Icommon -Iflows -Iconsensus -Itests \
	    $(filter %.c,$(C_FILES))

format:
	clang-format -i $(C_FILES)

# ---- Soft-RoCE VM tier (tests/rdma-vm; how it works: its README.md) -------
# test_rdma_vm.sh, part of `make test`, boots a VM with two rxe devices on a
# veth wire and checks RDMA between them. `make test-rdma` runs only that
# test; `make vm-shell` boots the same guest to an interactive shell;
# `make bench-rdma-baseline` prints perftest's ib_write_lat and ib_write_bw
# between the two devices (the baseline flows over verbs is compared with).
# Guest-side helper programs: tests/rdma-vm/rdma_*.c -> build/tests-aux/.
RDMA_VM_PROGS := $(patsubst tests/rdma-vm/%.c,$(BUILD)/tests-aux/%,$(wildcard tests/rdma-vm/rdma_*.c))
$(BUILD)/tests-aux/rdma_%: $(BUILD)/obj/tests/rdma-vm/rdma_%.o
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ $< $(LDLIBS)
tests: $(RDMA_VM_PROGS)

.PHONY: test-rdma vm-shell bench-rdma-baseline
test-rdma: deps
	@$(MAKE) --no-print-directory $(RDMA_VM_PROGS)
	@BUILD=$(BUILD) TEST_LOG_DIR=$(BUILD)/test-logs tests/run.sh -t $(TEST_TIMEOUT) \
	    tests/integration/test_rdma_vm.sh
vm-shell: deps
	@tests/rdma-vm/vm.sh shell
bench-rdma-baseline: deps
	@tests/rdma-vm/vm.sh run -t 300 tests/rdma-vm/bench-baseline.sh

# ---- fault-injection suite (tests/faults) ---------------------------------
# tests/integration/test_faults.sh runs each fault scenario (leader crash,
# follower restart, partition, packet loss, packet delay, sequencer
# failover, whole-cluster restart) for both protocols on 3 replicas in network
# namespaces (root, ip netns, nft), under kv_history's recorded workload,
# every history through the linearizability checker. It is part of `make
# test` (about 2.5 minutes); `make test-faults` runs it alone, and
# FX_ONLY=REGEX picks scenarios.
# Its packet delay: tests/faults/nfq_delay (libnetfilter_queue; this kernel
# has no sch_netem), built with the tests.
NFQ_DELAY := $(BUILD)/tests-aux/nfq_delay
$(NFQ_DELAY): tests/faults/nfq_delay.c
	@mkdir -p $(@D)
	@echo "  CC      $@"
	$(Q)$(CC) -std=gnu11 $(WARN) $(CFLAGS) $$(pkg-config --cflags libnetfilter_queue) -o $@ $< \
	    $$(pkg-config --libs libnetfilter_queue)
tests: $(NFQ_DELAY)
.PHONY: test-faults
test-faults: deps
	@$(MAKE) --no-print-directory all tests
	@BUILD=$(BUILD) TEST_LOG_DIR=$(BUILD)/test-logs tests/run.sh -t 900 \
	    tests/integration/test_faults.sh

# ---- flows benchmark (flows/bench) ----------------------------------------
# `make bench-flows` builds build/bin/flows-bench and runs it: flows over the
# tcp fabric against raw TCP measured in the same run, between two processes
# on loopback (flows/bench/flows_bench.c lists the measurements). It needs
# only libflows and libfkcommon. FLOWKV_FABRIC picks the backend.
FLOWS_BENCH := $(BUILD)/bin/flows-bench
$(FLOWS_BENCH): $(BUILD)/obj/flows/bench/flows_bench.o $(LIB_FLOWS) $(LIB_COMMON)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ $< $(LIB_FLOWS) $(LIB_COMMON) $(LDLIBS)

.PHONY: bench-flows
bench-flows: deps
	@$(MAKE) --no-print-directory $(FLOWS_BENCH)
	@timeout --kill-after=10 300 $(FLOWS_BENCH)

# ---- verbs backend on Soft-RoCE (flows/fabric/fab_verbs*.c, issue 4) -------
# tests/integration/test_rdma_verbs.sh (part of `make test`) boots the
# rdma-vm guest and runs tests/rdma-vm/verbs_suite.sh: the fabric and flows
# test programs with FLOWKV_FABRIC=verbs, a two-host test across the veth
# wire, and the verbs work-request counters. `make bench-rdma` runs
# tests/rdma-vm/verbs_bench.sh there: flows-bench over verbs with process A
# on rxe0/10.77.0.1 and process B on rxe1/10.77.0.2 (latency-mode round
# trip, bandwidth mode at 64-byte tuples) against perftest's ib_write_lat
# and ib_write_bw between the same two hosts, RUNS rounds (default 3), and
# prints `rdma-bench: latency_ratio=... bandwidth_ratio=...` (medians).
# tests/integration/test_rdma_cluster.sh (part of `make test`) runs the
# service itself there (tests/rdma-vm/cluster.sh): 3-replica clusters of
# both protocols with fabric = verbs, every CLI command, YCSB-B, kv_history
# through a leader's SIGKILL and restart, and each replica's verbs
# counters; `make test-rdma-cluster` runs only it.
.PHONY: test-rdma-cluster
test-rdma-cluster: deps
	@$(MAKE) --no-print-directory all tests
	@BUILD=$(BUILD) TEST_LOG_DIR=$(BUILD)/test-logs tests/run.sh -t $(TEST_TIMEOUT) \
	    tests/integration/test_rdma_cluster.sh

.PHONY: bench-rdma
bench-rdma: deps
	@$(MAKE) --no-print-directory $(FLOWS_BENCH)
	@tests/rdma-vm/vm.sh run -t 570 tests/rdma-vm/verbs_bench.sh $(abspath $(BUILD)) $(or $(RUNS),3)

# ---- fuzzing (tests/fuzz, libFuzzer from clang) ----------------------------
# Each tests/fuzz/fuzz_*.c is a libFuzzer target over untrusted bytes (wire
# decoders, replica message handlers), built with clang, ASan and UBSan in
# build/fuzz. `make fuzz` runs each for FUZZ_SECONDS (default 60);
# tests/integration/test_fuzz.sh runs a short round of it inside `make test`.
# A crash, a sanitizer report or a leak fails; the input is kept in
# build/fuzz/crashes/ for replay (build/fuzz/fuzz/NAME CRASHFILE).
FUZZ_SECONDS ?= 60
FUZZ_PROGS := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))
$(BUILD)/fuzz/%: $(BUILD)/obj/tests/fuzz/%.o $(LIBS)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_CFLAGS) -fsanitize=fuzzer -o $@ $< $(LIBS) $(LDLIBS)

.PHONY: fuzz fuzz-build fuzz-progs
fuzz-progs: $(FUZZ_PROGS)
fuzz-build: deps
	@$(MAKE) --no-print-directory BUILD=build/fuzz CC=clang SAN=address,undefined FUZZ=1 fuzz-progs
fuzz: fuzz-build
	@FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh build/fuzz

# ---- 5. install, clean -----------------------------------------------------
# What a user gets: the programs, the client library (the layers under it
# too: flows, the consensus wire codecs, common) as libflowkv.a and as the
# shared libflowkv.so.0 (soname; its objects compiled again with -fPIC in
# build/pic, so the programs' own objects stay as they are), its two
# headers (flowkv.h, the contract, and fk_error.h, the codes it returns),
# and flowkv.pc, so that `pkg-config --cflags --libs flowkv` links the
# shared library and `--static` the archive. deploy/ installs replicas
# with `make install DESTDIR=...`.
LIBFLOWKV := $(BUILD)/lib/libflowkv.a
# The client needs the cores' client-side codecs only (proto/fkc_proto.h):
# the wire format, Multi-Paxos' request and reply, NOPaxos' reply and
# quorum; not the replicas.
CLIENT_CODECS := consensus/cons_wire.c consensus/mpx_client.c consensus/nop_client.c
LIBFLOWKV_SRC := $(CLIENT_SRC) $(FLOWS_SRC) $(CLIENT_CODECS) $(COMMON_SRC)
$(LIBFLOWKV): $(call obj,$(LIBFLOWKV_SRC))
all: $(LIBFLOWKV)
# Requires.private: only what the client half links (no LMDB, no curl).
FLOWKV_VERSION = $(shell sed -n 's/^\#define FK_VERSION "\(.*\)"/\1/p' common/fk_version.h)
FLOWKV_PC_REQUIRES := libuv libxxhash libibverbs librdmacm inih libsodium
FLOWKV_SONAME := libflowkv.so.0
LIBFLOWKV_SO := $(BUILD)/lib/libflowkv.so.$(FLOWKV_VERSION)
$(BUILD)/pic/common/%.o: INCS = $(INC_common)
$(BUILD)/pic/flows/%.o: INCS = $(INC_flows)
$(BUILD)/pic/consensus/%.o: INCS = $(INC_consensus)
$(BUILD)/pic/client/%.o: INCS = $(INC_client)
$(BUILD)/pic/%.o: %.c
	@mkdir -p $(@D)
	@echo "  CC -fPIC $<"
	$(Q)$(CC) $(ALL_CFLAGS) -fPIC $(INCS) -c $< -o $@
$(LIBFLOWKV_SO): $(patsubst %.c,$(BUILD)/pic/%.o,$(LIBFLOWKV_SRC))
	@mkdir -p $(@D)
	@echo "  LD      $@"
	$(Q)$(CC) -shared -Wl,-soname,$(FLOWKV_SONAME) -Wl,--no-undefined $(SAN_FLAGS) -o $@ $^ \
	    $$(pkg-config --libs $(FLOWKV_PC_REQUIRES)) -lm -pthread
all: $(LIBFLOWKV_SO)
INSTALL_PROGS := $(SERVER_PROG) $(CLI_PROG) $(YCSB_PROG) $(SIM_PROG)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	    $(DESTDIR)$(PREFIX)/include/flowkv $(DESTDIR)$(PREFIX)/share/doc/flowkv
	install -m 755 $(INSTALL_PROGS) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIBFLOWKV) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIBFLOWKV_SO) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libflowkv.so.$(FLOWKV_VERSION) $(DESTDIR)$(PREFIX)/lib/$(FLOWKV_SONAME)
	ln -sf $(FLOWKV_SONAME) $(DESTDIR)$(PREFIX)/lib/libflowkv.so
	install -m 644 client/flowkv.h common/fk_error.h $(DESTDIR)$(PREFIX)/include/flowkv/
	install -m 644 README.md $(DESTDIR)$(PREFIX)/share/doc/flowkv/ # the units' Documentation=
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$${prefix}/lib' 'includedir=$${prefix}/include' '' \
	    'Name: flowkv' 'Description: client library of the flowkv replicated key-value store' \
	    'Version: $(FLOWKV_VERSION)' 'Requires.private: $(FLOWKV_PC_REQUIRES)' \
	    'Cflags: -I$${includedir}/flowkv' 'Libs: -L$${libdir} -lflowkv' \
	    'Libs.private: -lm -pthread' >$(DESTDIR)$(PREFIX)/lib/pkgconfig/flowkv.pc

clean:
	rm -rf build
