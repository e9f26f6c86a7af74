# memplan — one Makefile.  `make` builds ./memplan; `make test` runs every suite's quick
# tier (< 3 minutes on a loaded 2-core machine) and the replay of the measured accuracy
# rows; `make test-long` the long tier (MEMPLAN_TEST_LONG=1: the other models, plans and
# sizes, and the slow cases; tests/tier.h); CI runs both.  `make run` runs the main job on
# a bundled model.  They install missing build dependencies first (Debian: libcjson-dev
# libcmocka-dev) when run as root.
#
# Knobs: CUDA=auto|yes|no  BLAS=auto|yes|no  CUDA_HOME=/usr/local/cuda  CUDA_ARCH="70 75 80 86 89 90" (+ PTX of the last)
#        SAN=1 (AddressSanitizer + UBSan)  V=1 (echo commands)  T=<suite> (one test)

CC        ?= cc
NVCC      ?= nvcc
CUDA      ?= auto
CUDA_HOME ?= /usr/local/cuda
CUDA_ARCH ?= 70 75 80 86 89 90
CFLAGS    ?= -O2 -g
PREFIX    ?= /usr/local
BUILD     ?= build

ifneq ($(filter-out auto yes no,$(CUDA)),)
  $(error CUDA must be auto, yes or no (got '$(CUDA)'))
endif

Q := $(if $(V),,@)

# ---- feature detection --------------------------------------------------------
NVCC_PATH := $(shell command -v $(NVCC) 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
HAVE_CUBLAS := $(shell test -f $(CUDA_HOME)/include/cublas_v2.h && echo yes)
ifeq ($(CUDA),no)
  USE_CUDA :=
else ifneq ($(and $(NVCC_PATH),$(HAVE_CUBLAS)),)
  USE_CUDA := yes
else ifeq ($(CUDA),yes)
  $(error CUDA=yes but nvcc or $(CUDA_HOME)/include/cublas_v2.h was not found)
else
  USE_CUDA :=
endif

# CPU BLAS for the host backend's GEMMs (optional): OpenBLAS through cblas, found with
# pkg-config and checked by a real compile; BLAS=no builds the plain-C loops.
BLAS ?= auto
ifneq ($(filter-out auto yes no,$(BLAS)),)
  $(error BLAS must be auto, yes or no (got '$(BLAS)'))
endif
ifneq ($(BLAS),no)
  BLAS_PC := $(firstword $(foreach p,openblas cblas blas-openblas,$(shell pkg-config --exists $(p) 2>/dev/null && echo $(p))))
  BLAS_CFLAGS := $(if $(BLAS_PC),$(shell pkg-config --cflags $(BLAS_PC)))
  BLAS_LIBS := $(if $(BLAS_PC),$(shell pkg-config --libs $(BLAS_PC)))
  HAVE_CBLAS := $(if $(BLAS_PC),$(shell printf '\043include <cblas.h>\nint main(void){float a=1,b=1,c=0;cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasNoTrans,1,1,1,1.f,&a,1,&b,1,0.f,&c,1);return c!=1;}\n' | $(CC) $(BLAS_CFLAGS) -x c -o /dev/null - $(BLAS_LIBS) >/dev/null 2>&1 && echo yes))
endif
ifeq ($(HAVE_CBLAS),yes)
  USE_BLAS := yes
else ifeq ($(BLAS),yes)
  $(error BLAS=yes but no cblas (OpenBLAS) was found: make deps, or apt-get install libopenblas-dev)
endif

# DEPS_ROOT=DIR: libcjson/libyaml/libcmocka unpacked from .deb files under DIR (a machine without apt
# access, e.g. bench/gpu/run.sh with .deps/ carried along); headers and libraries come from there.
DEPS_ROOT ?=
ifneq ($(DEPS_ROOT),)
  DEPS_LIBDIR := $(DEPS_ROOT)/usr/lib/$(shell $(CC) -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
  override CFLAGS += -I$(DEPS_ROOT)/usr/include
  override LDFLAGS += -L$(DEPS_LIBDIR) -Wl,-rpath,$(DEPS_LIBDIR)
endif

PKG_CFLAGS := $(shell pkg-config --cflags libcjson yaml-0.1 cmocka 2>/dev/null)
CJSON_LIBS := $(or $(shell pkg-config --libs libcjson 2>/dev/null),-lcjson)
# libyaml reads --recipe files (YAML, and JSON as YAML)
YAML_LIBS := $(or $(shell pkg-config --libs yaml-0.1 2>/dev/null),-lyaml)
CMOCKA_LIBS := $(or $(shell pkg-config --libs cmocka 2>/dev/null),-lcmocka)

WARN := -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
        -Wcast-qual -Werror=implicit-function-declaration -Werror=switch -Wno-format-truncation
override CFLAGS += -std=c11 $(WARN) -D_POSIX_C_SOURCE=200809L -pthread -Isrc $(PKG_CFLAGS) -MMD -MP \
                   -DMEMPLAN_DATADIR='"$(PREFIX)/share/memplan"'
LDLIBS := $(CJSON_LIBS) $(YAML_LIBS) -lm

ifeq ($(USE_BLAS),yes)
  override CFLAGS += -DMEMPLAN_HAVE_CBLAS $(BLAS_CFLAGS)
  LDLIBS += $(BLAS_LIBS)
endif

ifeq ($(SAN),1)
  override CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  override LDFLAGS += -fsanitize=address,undefined
endif

# src/<folder>/ in pipeline order (README's map; tests/deps.py holds the order); probe/cuda/ only with CUDA
SRCS := $(sort $(filter-out src/probe/cuda/%,$(shell find src -name '*.c')))
KSRCS :=
ifeq ($(USE_CUDA),yes)
  override CFLAGS += -DMEMPLAN_HAVE_CUDA -I$(CUDA_HOME)/include
  SRCS += $(wildcard src/probe/cuda/*.c)
  KSRCS := $(wildcard kernels/*.cu)
  # cuBLAS is dlopen()ed by the cuda backend when it opens (see src/probe/cuda/probe_cuda.c), not linked
  override CFLAGS += -DMEMPLAN_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"'
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++
  # the architectures this nvcc can build (CUDA 13 dropped sm_70: build V100 code with CUDA 12)
  NVCC_ARCHS := $(patsubst compute_%,%,$(shell $(NVCC_PATH) --list-gpu-arch 2>/dev/null))
  CUDA_ARCH_OK := $(if $(NVCC_ARCHS),$(filter $(NVCC_ARCHS),$(CUDA_ARCH)),$(CUDA_ARCH))
  CUDA_ARCH_DROPPED := $(filter-out $(CUDA_ARCH_OK),$(CUDA_ARCH))
  ifeq ($(strip $(CUDA_ARCH_OK)),)
    $(error CUDA_ARCH '$(CUDA_ARCH)': none of these is supported by $(NVCC_PATH) ($(NVCC_ARCHS)))
  endif
  NVFLAGS := -O2 -std=c++17 -MMD -MP -Ikernels -Isrc $(foreach a,$(CUDA_ARCH_OK),-gencode arch=compute_$(a),code=sm_$(a)) \
             -gencode arch=compute_$(lastword $(CUDA_ARCH_OK)),code=compute_$(lastword $(CUDA_ARCH_OK))
endif

OBJS  := $(SRCS:%.c=$(BUILD)/%.o) $(KSRCS:%.cu=$(BUILD)/%.o)
LIBOBJS := $(filter-out $(BUILD)/src/cli/main.o,$(OBJS))
TESTS := $(patsubst tests/test_%.c,%,$(wildcard tests/test_*.c))
TESTBINS := $(TESTS:%=$(BUILD)/tests/test_%)
# the suites with a long tier (tests/tier.h's run_tiers); MEMPLAN_TEST_LONG=1 selects it
LONG_TESTS := $(patsubst tests/test_%.c,%,$(shell grep -l run_tiers tests/test_*.c))
TIER_LONG := $(filter-out 0,$(MEMPLAN_TEST_LONG))

$(info I memplan build: BLAS=$(BLAS) -> $(if $(USE_BLAS),✓ cblas for the host backend ($(BLAS_PC)),✗ cblas (host GEMMs in plain C; make deps installs OpenBLAS)))
$(info I memplan build: CC=$(CC) CUDA=$(CUDA) SAN=$(or $(SAN),0) -> $(if $(USE_CUDA),✓ cuda backend ($(NVCC_PATH)),✗ cuda backend (host only)))
$(if $(USE_CUDA),$(info I memplan build: cuda targets sm $(CUDA_ARCH_OK) + PTX $(lastword $(CUDA_ARCH_OK))))
$(if $(and $(USE_CUDA),$(CUDA_ARCH_DROPPED)),$(info I memplan build: ✗ sm $(CUDA_ARCH_DROPPED): not supported by this nvcc$(if $(filter 70,$(CUDA_ARCH_DROPPED)), (CUDA 13 dropped Volta; V100 needs CUDA 12))))

.PHONY: all deps run test test-long test-unit test-cli test-gpu check-man bench install clean
all: memplan

# ./memplan is shared by every BUILD directory: a stamp of what it was linked from
# (directory, compiler, flags) relinks it whenever that changes, so a sanitizer
# build never stays behind as ./memplan after a plain `make`.
LINK_STAMP := .memplan-link
LINK_WHAT := $(BUILD) $(CC) $(CFLAGS) $(LDFLAGS) $(LDLIBS)
ifneq ($(file <$(LINK_STAMP)),$(LINK_WHAT))
  $(file >$(LINK_STAMP),$(LINK_WHAT))
endif

# A BUILD directory's objects are recompiled when what compiles them changes (git's GIT-CFLAGS):
# `make CUDA=no` after a CUDA build drops -DMEMPLAN_HAVE_CUDA, and objects compiled with it would
# not link without the cuda backend.
CC_STAMP := $(BUILD)/.compile
CC_WHAT := $(CC) $(CFLAGS) $(NVFLAGS)
ifneq ($(file <$(CC_STAMP)),$(CC_WHAT))
  $(shell mkdir -p $(BUILD))
  $(file >$(CC_STAMP),$(CC_WHAT))
endif

memplan: $(OBJS) $(LINK_STAMP)
	@echo "  LD    $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(OBJS) $(LDLIBS)

$(BUILD)/%.o: %.c $(CC_STAMP)
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.o: %.cu $(CC_STAMP)
	@mkdir -p $(dir $@)
	@echo "  NVCC  $<"
	$(Q)$(NVCC_PATH) $(NVFLAGS) -c -o $@ $<

$(BUILD)/tests/test_%: tests/test_%.c $(LIBOBJS)
	@mkdir -p $(dir $@)
	@echo "  CC    $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS) $(CMOCKA_LIBS)

# bench/accuracy/dump_saved.c: memplan's saved tensors as JSON lines (bench/accuracy/torch_saved_build.sh)
$(BUILD)/bench/accuracy/dump_saved: bench/accuracy/dump_saved.c $(LIBOBJS)
	@mkdir -p $(dir $@)
	@echo "  CC    $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# bench/alloc/asim_replay.c: the allocator simulation over a recorded request sequence (the GPU's)
$(BUILD)/bench/alloc/asim_replay: bench/alloc/asim_replay.c $(LIBOBJS)
	@mkdir -p $(dir $@)
	@echo "  CC    $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# Install the three Debian build dependencies when they are missing (root only).
deps:
	@if { [ ! -f /usr/include/cjson/cJSON.h ] || [ ! -f /usr/include/cmocka.h ] || [ ! -f /usr/include/yaml.h ]; } && \
	    { [ -z "$(DEPS_ROOT)" ] || [ ! -f "$(DEPS_ROOT)/usr/include/cjson/cJSON.h" ] || \
	      [ ! -f "$(DEPS_ROOT)/usr/include/cmocka.h" ] || [ ! -f "$(DEPS_ROOT)/usr/include/yaml.h" ]; }; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "I installing libcjson-dev libyaml-dev libcmocka-dev"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libcjson-dev libyaml-dev libcmocka-dev pkg-config >/dev/null; \
	  else echo "memplan: need libcjson-dev, libyaml-dev and libcmocka-dev (apt-get install libcjson-dev libyaml-dev libcmocka-dev)" >&2; exit 1; fi; \
	fi
	@# optional: OpenBLAS makes the host backend's GEMMs fast (a failure here is not an error)
	@if [ "$(BLAS)" != no ] && ! pkg-config --exists openblas 2>/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "I installing libopenblas-dev (optional: fast host probes)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas-dev >/dev/null 2>&1 || \
	    echo "I libopenblas-dev not installed: the host backend uses plain C"; \
	fi

RUN_MODEL ?= models/gpt2-124m.json
run: deps
	$(Q)$(MAKE) --no-print-directory memplan
	./memplan suggest $(RUN_MODEL)

ASAN_ENV := ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1
test: deps
	$(Q)$(MAKE) --no-print-directory memplan $(TESTBINS) $(BUILD)/bench/alloc/asim_replay
	$(Q)$(MAKE) --no-print-directory test-unit test-cli

# the long tier: the suites that have one (LONG_TESTS) and tests/cli.sh's long loops
test-long: deps
	$(Q)$(MAKE) --no-print-directory memplan $(TESTBINS)
	$(Q)MEMPLAN_TEST_LONG=1 $(MAKE) --no-print-directory test-unit test-cli

test-unit: $(TESTBINS)
	@fail=0; for t in $(if $(T),$(BUILD)/tests/test_$(T),$(if $(TIER_LONG),$(LONG_TESTS:%=$(BUILD)/tests/test_%),$(TESTBINS))); do \
	  echo "== $$t"; $(ASAN_ENV) $$t || fail=$$((fail+1)); done; \
	if [ $$fail -ne 0 ]; then echo "$$fail test suite(s) failed"; exit 1; fi

# tests/replay_accuracy.py: the oracles' measured rows (bench/accuracy/rows) against memplan
test-cli: memplan $(BUILD)/bench/alloc/asim_replay
	$(ASAN_ENV) sh tests/cli.sh ./memplan
	@# the Python API (python/memplan) against the binary and README's JSON contract (long: suggest on every model)
	@if command -v python3 >/dev/null; then $(ASAN_ENV) python3 -B tests/py_api.py ./memplan; fi
ifneq ($(TIER_LONG),)
	@# MemplanCallback in real Trainer and SFTTrainer runs on the CPU (each library absent: skip)
	@if command -v python3 >/dev/null; then $(ASAN_ENV) python3 -B tests/py_trainer.py ./memplan 2>/dev/null; fi
	@# pip wheel . into a fresh venv (it compiles its own binary: not again under SAN=1)
	@if command -v python3 >/dev/null && [ "$(SAN)" != 1 ]; then python3 -B tests/py_wheel.py ./memplan; fi
endif
ifeq ($(TIER_LONG),)
	$(ASAN_ENV) sh tests/cli_output.sh ./memplan
	@if command -v python3 >/dev/null; then $(ASAN_ENV) python3 tests/replay_accuracy.py ./memplan; \
	else echo "skip tests/replay_accuracy.py (no python3)"; fi
	@if command -v python3 >/dev/null; then python3 tests/man_options.py ./memplan; fi
	@if command -v python3 >/dev/null; then python3 -B tests/recipes_real.py 2>/dev/null; fi
	@if command -v python3 >/dev/null; then python3 -B tests/emit_real.py ./memplan 2>/dev/null; fi
	@if command -v python3 >/dev/null && command -v nm >/dev/null; then python3 tests/deps.py $(BUILD); fi
	@if command -v python3 >/dev/null; then python3 -B tests/doc_refs.py; else echo "doc_refs: skipped (no python3)"; fi
	@if command -v python3 >/dev/null; then python3 -B tests/family_coverage.py ./memplan; fi
	@if command -v python3 >/dev/null; then python3 -B tests/alloc_trace.py ./memplan; fi
	@if command -v python3 >/dev/null; then python3 -B tests/alloc_gpu_replay.py $(BUILD)/bench/alloc/asim_replay; fi
	@# the GPU's measured rows (bench/results/gpu-2026-11-28b.json) against memplan: each allocated peak within 1 %
	@if command -v python3 >/dev/null; then $(ASAN_ENV) python3 -B bench/gpu/reestimate.py --memplan ./memplan >/dev/null \
	  && echo "ok   bench/gpu/reestimate.py: the H200's 16 matrix rows and 12 DPO rows within 1 % allocated" \
	  || { python3 -B bench/gpu/reestimate.py --memplan ./memplan; exit 1; }; fi
endif

test-gpu: memplan $(BUILD)/tests/test_probe $(BUILD)/tests/test_probe_ops $(BUILD)/tests/test_probe_suggest
	$(BUILD)/tests/test_probe
	$(BUILD)/tests/test_probe_ops
	$(BUILD)/tests/test_probe_suggest

# ---- fuzzing (clang's libFuzzer; tests/fuzz/README) -------------------------------------------
# `make fuzz` builds two harnesses with ASan + UBSan into build-fuzz/ and runs each half of
# FUZZ_TIME seconds: fuzz_model (tests/fuzz/fuzz_model.c: bytes as a model file, then the
# builder, estimator and planners) on every bundled model and tests/data (libFuzzer reads a
# directory recursively, so models/ brings models/hf/ once), and fuzz_cli (tests/fuzz/fuzz_cli.c:
# option values, a GPU profile and a model through main()) on tests/fuzz/cli.  Any crash,
# leak, sanitizer report, wrong exit status or input slower than 10 s fails.  New inputs go
# to build-fuzz/corpus and build-fuzz/corpus-cli, a failing one to build-fuzz/{model,cli}-*.
FUZZ_CC ?= clang
FUZZ_TIME ?= 60
FUZZ_DIR := build-fuzz
FUZZ_SRCS := $(filter-out src/cli/main.c src/probe/cuda/%,$(SRCS))
FUZZ_FLAGS := -g -O1 -std=c11 -D_POSIX_C_SOURCE=200809L -Isrc $(PKG_CFLAGS) -DMEMPLAN_DATADIR='"$(PREFIX)/share/memplan"' \
              -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_OBJS := $(FUZZ_SRCS:%.c=$(FUZZ_DIR)/%.o)
FUZZ_RUN := ASAN_OPTIONS=detect_leaks=1
FUZZ_ARGS = -max_total_time=$$(( ($(FUZZ_TIME) + 1) / 2 )) -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
            -print_final_stats=1

$(FUZZ_DIR)/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC    $< (fuzz)"
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c -o $@ $<

# fuzz_cli calls main() of src/cli/main.c, compiled here as mp_cli_main
$(FUZZ_DIR)/src/main_cli.o: src/cli/main.c
	@mkdir -p $(dir $@)
	@echo "  CC    $< (fuzz, main as mp_cli_main)"
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -Dmain=mp_cli_main -MMD -MP -c -o $@ $<

$(FUZZ_DIR)/fuzz_model: tests/fuzz/fuzz_model.c $(FUZZ_OBJS)
	@echo "  LD    $@"
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $^ $(CJSON_LIBS) $(YAML_LIBS) -lm

$(FUZZ_DIR)/fuzz_cli: tests/fuzz/fuzz_cli.c $(FUZZ_DIR)/src/main_cli.o $(FUZZ_OBJS)
	@echo "  LD    $@"
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $^ $(CJSON_LIBS) $(YAML_LIBS) -lm

.PHONY: fuzz sweep
fuzz: deps $(FUZZ_DIR)/fuzz_model $(FUZZ_DIR)/fuzz_cli
	@mkdir -p $(FUZZ_DIR)/corpus $(FUZZ_DIR)/corpus-cli
	$(FUZZ_RUN) $(FUZZ_DIR)/fuzz_model $(FUZZ_ARGS) -artifact_prefix=$(FUZZ_DIR)/model- \
	    $(FUZZ_DIR)/corpus models tests/data
	$(FUZZ_RUN) $(FUZZ_DIR)/fuzz_cli $(FUZZ_ARGS) -artifact_prefix=$(FUZZ_DIR)/cli- -dict=tests/fuzz/cli.dict \
	    $(FUZZ_DIR)/corpus-cli tests/fuzz/cli

# `make sweep` runs tests/sweep.sh on ./memplan: every numeric option at its edge values, every
# bundled model at huge batch and sequence, odd files and odd GPU profiles, each under a time
# and memory limit (CI runs it on the sanitizer build: make sweep SAN=1 BUILD=build-san).
sweep: memplan
	sh tests/sweep.sh ./memplan

check-man:
	groff -man -Tutf8 -ww -z man/memplan.1

bench: memplan
	sh bench/speed/run.sh

install: memplan
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 755 memplan $(DESTDIR)$(PREFIX)/bin/memplan
	install -m 644 man/memplan.1 $(DESTDIR)$(PREFIX)/share/man/man1/memplan.1
	install -d $(DESTDIR)$(PREFIX)/share/memplan/gpus
	install -m 644 configs/gpus/*.json $(DESTDIR)$(PREFIX)/share/memplan/gpus/

clean:
	rm -rf $(BUILD) $(FUZZ_DIR) memplan $(LINK_STAMP)

-include $(OBJS:.o=.d) $(TESTBINS:%=%.d) $(FUZZ_OBJS:.o=.d) $(FUZZ_DIR)/src/main_cli.d
