# glmtrain — build, test, demo. `make` builds build/glmtrain (with the CUDA backend when nvcc is
# present; CUDA=0 turns it off). `make test` runs the CPU suite and ends with "N passed, N failed".
CC       ?= gcc
NVCC     ?= nvcc
PYTHON   ?= /usr/bin/python3
ARCHFLAGS ?= -march=x86-64-v3
OPT      ?= -O3 $(ARCHFLAGS)
# -fno-trapping-math: no FP exception is ever enabled here, so gcc may vectorize loops with
# comparisons and selects (GELU's tanh); -fno-math-errno: nothing reads errno after a math call,
# so sqrtf becomes the (exactly rounded) vector square root, e.g. in the host's AdamW; no result
# changes (reassociation stays off).
CFLAGS   := $(OPT) -fno-trapping-math -fno-math-errno -std=c11 -D_GNU_SOURCE -fopenmp -Isrc -I/usr/include/cjson -Wall -Wextra -Wno-unused-parameter -MMD -MP
LDLIBS   += -lcjson -lpcre2-8 -lyaml -lm -lpthread -ldl
BUILD    ?= build

NVCC_PATH := $(shell command -v $(NVCC) 2>/dev/null)
ifeq ($(CUDA),0)
  NVCC_PATH :=
endif

LIB_SRC  := $(shell find src -name '*.c' ! -path 'src/cli/main.c' ! -path 'src/backend/cuda/*' | sort)
CU_SRC   := $(shell find src -name '*.cu' | sort)
ifneq ($(NVCC_PATH),)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC_PATH))
  CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
  LIB_SRC  += $(shell find src/backend/cuda -name '*.c' | sort)
  CFLAGS   += -DGLM_HAVE_CUDA -I$(CUDA_HOME)/include
  LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lcublas -lnccl -lstdc++
  # Hopper code for the H100/H200, Ampere code that A100/A10/RTX 30xx/40xx (sm_80/86/89) run,
  # Turing code (T4, RTX 20xx: sm_75, the oldest CUDA 13 builds for; no bf16 there), and the
  # Ampere PTX, which the driver compiles on first use for GPUs newer than all of them
  # (Blackwell: B200 sm_100, RTX 50xx sm_120), whose devices run none of the machine code
  NVCC_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_75,code=sm_75 \
               -gencode arch=compute_80,code=compute_80
  NVCCFLAGS ?= -O3 $(NVCC_ARCH) -std=c++17 -Isrc -Xcompiler -fPIC --expt-relaxed-constexpr
  NVCCFLAGS += -MMD -MP
  # GPU tests and the training benchmark: built with the CUDA backend only (run on a GPU machine)
  CUDA_TEST_BIN := $(patsubst tests/cuda/%.c,$(BUILD)/tests/cuda/%,$(sort $(wildcard tests/cuda/test_*.c)))
  CUDA_BINS := $(CUDA_TEST_BIN) $(BUILD)/bench_train $(BUILD)/bench_decode $(BUILD)/bench_attn $(BUILD)/bench_ops $(BUILD)/bench_svd $(BUILD)/bench_gemm $(BUILD)/overlap_probe
endif

# MPI for data parallelism on CPU ranks (OpenMPI; src/parallel/comm/comm_mpi.c): on when mpicc is
# found, so `make test` proves data parallel on CPU ranks wherever it runs (CI too, nvcc or
# not). Binaries carried to the GPU machines are built with MPI=0: those have no MPI runtime
# (a binary linked with libmpi would not start there) and GPU ranks talk through NCCL.
MPI ?= 1
ifeq ($(MPI),1)
  ifneq ($(shell command -v mpicc 2>/dev/null),)
    CFLAGS += -DGLM_HAVE_MPI $(shell mpicc --showme:compile)
    LDLIBS += $(shell mpicc --showme:link)
  endif
endif

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
# Objects are rebuilt when the flags change (e.g. CUDA=0 after a CUDA build in the same folder).
FLAGS_STAMP := $(BUILD)/.flags-$(shell echo '$(CFLAGS) $(NVCCFLAGS) $(LDLIBS)' | md5sum | cut -c1-12)
TEST_SRC := $(sort $(wildcard tests/c/test_*.c tests/c/tool_*.c))
TEST_BIN := $(TEST_SRC:tests/c/%.c=$(BUILD)/tests/%)

.PHONY: all test test-asan test-cuda demo bench-cpu bench-tokenizer clean deps fuzz
all: $(BUILD)/glmtrain $(TEST_BIN)

$(FLAGS_STAMP):
	@mkdir -p $(BUILD) && rm -f $(BUILD)/.flags-* && touch $@

$(BUILD)/obj/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# the wgmma attention kernels exist only as sm_90a code (wgmma is not in plain sm_90 or PTX);
# the backend runs them on 9.0 devices alone, every other GPU takes k_flash.cu. `override`: an
# NVCC_ARCH given on the command line (a build for one's own GPU) must not replace it here
$(BUILD)/obj/src/backend/cuda/k_flash90.o: override NVCC_ARCH = -gencode arch=compute_90a,code=sm_90a

# serve: libmicrohttpd's header at build time (libmicrohttpd-dev); the library itself is opened
# with dlopen when serve starts (src/serve/server.c), so no other command or GPU carry needs it.
# The web chat page is embedded into this object (.incbin): rebuilt when the page changes.
$(BUILD)/obj/src/serve/page.o: src/serve/chat_page.html

$(BUILD)/libglm.a: $(LIB_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/glmtrain: $(BUILD)/obj/src/cli/main.o $(BUILD)/libglm.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# `glmtrain --version`: the commit this tree is (git describe, "-dirty" with uncommitted changes)
# and what the build holds, in a header rewritten only when that changes, so main.c alone rebuilds
VERSION_H := $(BUILD)/gen/glm_version.h
comma := ,
GLM_CUDA_ARCHS := $(if $(NVCC_PATH),$(patsubst code=%,%,$(filter code=%,$(subst $(comma), ,$(NVCC_ARCH)))),)
.PHONY: version-stamp
$(VERSION_H): version-stamp
	@mkdir -p $(BUILD)/gen
	@c=$$(git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown); \
	 printf '#define GLM_VERSION_COMMIT "%s"\n#define GLM_VERSION_CUDA_ARCHS "%s"\n' "$$c" "$(strip $(GLM_CUDA_ARCHS))" > $(VERSION_H).tmp; \
	 cmp -s $(VERSION_H).tmp $(VERSION_H) && rm -f $(VERSION_H).tmp || mv $(VERSION_H).tmp $(VERSION_H)
version-stamp: ;
$(BUILD)/obj/src/cli/main.o: $(VERSION_H)
$(BUILD)/obj/src/cli/main.o: CFLAGS += -I$(BUILD)/gen

$(BUILD)/tests/%: tests/c/%.c $(BUILD)/libglm.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/c $< $(BUILD)/libglm.a -o $@ $(LDLIBS)

all: $(CUDA_BINS)

$(BUILD)/tests/cuda/%: tests/cuda/%.c tests/cuda/cuda_test_util.h $(BUILD)/libglm.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/c -Itests/cuda $< $(BUILD)/libglm.a -o $@ $(LDLIBS)

$(BUILD)/bench_train: bench/bench_train.c bench/bench_common.h $(BUILD)/libglm.a
	$(CC) $(CFLAGS) $< $(BUILD)/libglm.a -o $@ $(LDLIBS)

$(BUILD)/bench_decode: bench/bench_decode.c bench/bench_common.h $(BUILD)/libglm.a
	$(CC) $(CFLAGS) $< $(BUILD)/libglm.a -o $@ $(LDLIBS)

$(BUILD)/bench_attn: bench/bench_attn.c $(BUILD)/libglm.a
	$(CC) $(CFLAGS) $< $(BUILD)/libglm.a -o $@ $(LDLIBS)

$(BUILD)/bench_ops: bench/bench_ops.c $(BUILD)/libglm.a
	$(CC) $(CFLAGS) $< $(BUILD)/libglm.a -o $@ $(LDLIBS)

$(BUILD)/bench_svd: bench/bench_svd.c $(BUILD)/libglm.a
	$(CC) $(CFLAGS) $< $(BUILD)/libglm.a -o $@ $(LDLIBS)

# cuBLASLt's first heuristic pick against its fastest candidate, per product of a step
$(BUILD)/bench_gemm: bench/bench_gemm.c $(FLAGS_STAMP)
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

# 2 GPUs: how gradient traffic beside backward-shaped GEMMs slows them, by transport (docs/PERF.md)
$(BUILD)/overlap_probe: bench/overlap_probe.cu $(FLAGS_STAMP)
	$(NVCC) -O3 $(NVCC_ARCH) $< -o $@ -lcublas -lnccl

# Everything CPU-side; the last line is "N passed, N failed, N skipped".
test: all
	@BUILD=$(BUILD) PYTHON=$(PYTHON) bash tests/run.sh

# The C tests again under AddressSanitizer + UBSan (CPU only), and the server's quick tests: the
# engine and HTTP threads share requests whose lifetimes the C tests do not reach.
ASAN_PY := $(addprefix tests/py/,test_serve.py test_serve_echo.py test_serve_score.py test_serve_logprobs.py \
                                 test_serve_thudm_api.py test_glmz1.py test_serve_prefix.py \
                                 test_serve_penalties.py test_serve_chunked.py test_chat_cache.py \
                                 test_prompt_lookup.py test_serve_lookup.py test_serve_constrained.py \
                                 test_schema_keywords.py test_generate_guided.py test_regex.py test_serve_tools_glm4.py)
test-asan:
	$(MAKE) BUILD=build-asan CUDA=0 OPT="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer" all
	@BUILD=build-asan PYTHON=$(PYTHON) ONLY_C=1 ASAN_PY="$(ASAN_PY)" bash tests/run.sh

# libFuzzer targets, one per parser (tests/fuzz, clang + ASan/UBSan), each run for FUZZ_SECONDS
# from the seeds in tests/fuzz/seeds; `make test` runs them for 15 s each (docs/RELIABILITY.md).
FUZZ_SECONDS ?= 60
fuzz:
	@FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_BUILD=$(BUILD)/fuzz bash tests/sh/test_fuzz.sh

# GPU tests (run on the GPU machine): every CUDA op against its CPU twin, the model on CUDA vs
# the CPU, a 50-step training curve, compute-sanitizer memcheck/racecheck. docs/GPU-TESTS.md.
test-cuda: all
	@BUILD=$(BUILD) bash tests/run_cuda.sh

bench-tokenizer: all
	bash bench/bench_tokenizer.sh

bench-cpu: all
	$(BUILD)/tests/tool_bench_cpu

deps:
	bash scripts/install-deps.sh

# The main job on an embedded default: poems -> tokenizer -> small GLM -> generations.
demo:
	bash scripts/demo.sh

clean:
	rm -rf build build-asan

-include $(LIB_OBJ:.o=.d) $(BUILD)/obj/src/cli/main.d $(CU_OBJ:.o=.d)
