# nobubble build. `make` builds build/nobubble; `make test` builds and runs every test;
# `make tsan` runs the lanes tests under ThreadSanitizer; `make asan` builds the CPU engine and its
# tests with AddressSanitizer + UBSan into build-asan (tests/asan_test.sh runs them). CUDA code is
# compiled whenever nvcc is found (NB_CUDA=0 turns it off), so build breaks show on machines
# without a GPU too.
ifeq ($(origin CC),default)
  CC := gcc
endif
NVCC    ?= nvcc
BUILD   ?= build
OPT     ?= -O3 -march=x86-64-v2 -mtune=native
# -fno-math-errno and -fno-trapping-math change no value (nothing here reads errno after libm or
# traps on FP exceptions); they let loops of floorf, conversions and selects vectorize (vmath.h).
# Contraction stays off (C11 mode): no FMA, so every vector width gives the same bits.
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter $(OPT) -fno-math-errno -fno-trapping-math \
           -fopenmp -g -Isrc -Isrc/core -Itools -MMD -MP
# OpenBLAS's OpenMP build shares libgomp's thread pool with our own parallel loops; the pthread
# build runs a second pool whose threads spin against ours (measured: 5x slower steps on 2 cores).
BLAS_DIR ?= /usr/lib/x86_64-linux-gnu/openblas-openmp
BLAS_INC ?= /usr/include/x86_64-linux-gnu/openblas-openmp
CFLAGS  += -I$(BLAS_INC)
# utf8proc (Debian: libutf8proc-dev): NFC for the Hugging Face tokenizers that ask for it (Qwen).
# UTF8PROC_ROOT: an unpacked libutf8proc-dev tree where it is not installed (scripts/device_deps.sh)
ifneq ($(UTF8PROC_ROOT),)
  CFLAGS += -I$(UTF8PROC_ROOT)/usr/include
  LDLIBS += -L$(UTF8PROC_ROOT)/usr/lib/x86_64-linux-gnu -Wl,-rpath,$(UTF8PROC_ROOT)/usr/lib/x86_64-linux-gnu
endif
comma := ,
# zlib (Debian: zlib1g-dev) reads gzip-compressed data files; ZLIB_INC / ZLIB_DIR point at another
# copy (scripts/device_deps.sh sets them on machines without the package).
ZLIB_INC ?=
ZLIB_DIR ?=
CFLAGS  += $(if $(ZLIB_INC),-I$(ZLIB_INC))
LDLIBS  += $(if $(ZLIB_DIR),-L$(ZLIB_DIR) -Wl$(comma)-rpath$(comma)$(ZLIB_DIR))
LDLIBS  += -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas -lz -lutf8proc -lm -lpthread -fopenmp

# MPI (required for more than one rank; Debian: libopenmpi-dev, installed by scripts/setup.sh).
# Found through mpicc; MPI_INC / MPI_LIBDIR point elsewhere (scripts/device_deps.sh does);
# NB_MPI=0 builds without it (one rank only; several ranks then fail with a hint).
ifeq ($(origin MPI_INC),undefined)
  MPI_INC := $(patsubst -I%,%,$(filter -I%,$(shell mpicc --showme:compile 2>/dev/null)))
endif
ifeq ($(origin MPI_LIBDIR),undefined)
  MPI_LIBDIR := $(patsubst -L%,%,$(filter -L%,$(shell mpicc --showme:link 2>/dev/null)))
endif
NB_MPI ?= $(if $(wildcard $(addsuffix /mpi.h,$(MPI_INC))),1,0)
ifeq ($(NB_MPI),1)
  CFLAGS += -DNB_WITH_MPI $(addprefix -I,$(MPI_INC))
  LDLIBS += $(addprefix -L,$(MPI_LIBDIR)) $(addprefix -Wl$(comma)-rpath$(comma),$(MPI_LIBDIR)) -lmpi
endif
# SANITIZE: -fsanitize flags for compiling and linking (the asan target sets them).
ifneq ($(SANITIZE),)
  CFLAGS += $(SANITIZE)
  LDLIBS += $(SANITIZE)
endif

CUDA_HOME ?= /usr/local/cuda
NB_CUDA   ?= $(if $(shell which $(NVCC) 2>/dev/null),1,0)
CUDA_ARCH ?= -gencode arch=compute_90a,code=sm_90a
NVFLAGS   += -O3 -std=c++17 $(CUDA_ARCH) -Isrc -Isrc/core --expt-relaxed-constexpr \
             -Xcompiler -Wall,-Wextra,-Wno-unused-parameter -DNB_WITH_CUDA

LIB_SRC  := $(sort $(wildcard src/*/*.c))
CU_SRC   := $(sort $(wildcard src/*/*.cu))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
# NCCL (GPU collectives, --comm nccl): where nccl.h is, CUDA_HOME by default; NCCL_HOME=DIR
# for another (e.g. the nvidia-nccl Python wheel's nvidia/nccl folder, which has lib/libnccl.so.2).
NCCL_HOME ?= $(CUDA_HOME)
NCCL_LIB ?= $(firstword $(wildcard $(NCCL_HOME)/lib64/libnccl.so* $(NCCL_HOME)/lib/libnccl.so*))
NB_NCCL ?= $(if $(and $(wildcard $(NCCL_HOME)/include/nccl.h),$(NCCL_LIB)),1,0)
ifeq ($(NB_CUDA),1)
  CFLAGS  += -DNB_WITH_CUDA -I$(CUDA_HOME)/include
  # -ldl: cuDNN (src/ops/attention_cudnn.c) and cuBLASLt (src/core/cublaslt_load.c) are dlopen'ed
  # when a GPU backend first needs them, never linked: loading cuBLASLt costs ~0.35 s a process
  LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lstdc++ -ldl
  ifeq ($(NB_NCCL),1)
    NCCL_DIR := $(dir $(NCCL_LIB))
    CFLAGS += -DNB_WITH_NCCL -I$(NCCL_HOME)/include
    LDLIBS += -L$(NCCL_DIR) -Wl,-rpath,$(NCCL_DIR) $(if $(wildcard $(NCCL_DIR)libnccl.so),-lnccl,-l:$(notdir $(NCCL_LIB)))
  endif
  ALL_OBJ := $(LIB_OBJ) $(CU_OBJ)
else
  ALL_OBJ := $(LIB_OBJ)
endif

TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

.PHONY: install uninstall all test tsan asan clean
all: $(BUILD)/nobubble $(TEST_BIN)

# rebuilt from scratch: ar would keep the members of sources that no longer exist
$(BUILD)/libnobubble.a: $(ALL_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

TOOL_SRC := $(sort $(wildcard tools/*.c))
TOOL_OBJ := $(TOOL_SRC:%.c=$(BUILD)/%.o)

$(BUILD)/nobubble: $(TOOL_OBJ) $(BUILD)/libnobubble.a
	$(CC) -o $@ $^ $(LDLIBS)

# Objects depend on the flags they were built with: switching NB_CUDA or OPT rebuilds them.
FLAGS_STAMP := $(BUILD)/.flags
FLAGS_NOW := $(CC) $(CFLAGS) | $(NVCC) $(NVFLAGS) | $(NB_CUDA)
$(shell mkdir -p $(BUILD); [ "$$(cat $(FLAGS_STAMP) 2>/dev/null)" = '$(FLAGS_NOW)' ] || echo '$(FLAGS_NOW)' > $(FLAGS_STAMP))

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.cu.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -MF $(@:.o=.d) -c -o $@ $<

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libnobubble.a
	$(CC) -o $@ $^ $(LDLIBS)

# the op-test runner and its table: one file of rows per op family (tests/ops/*.c)
OPTEST_SRC := $(sort $(wildcard tests/ops/*.c))
OPTEST_OBJ := $(OPTEST_SRC:%.c=$(BUILD)/%.o)
$(BUILD)/tests/test_ops: $(BUILD)/tests/test_ops.o $(OPTEST_OBJ) $(BUILD)/libnobubble.a
	$(CC) -o $@ $^ $(LDLIBS)

test: all
	bash tests/run.sh $(BUILD)

# ThreadSanitizer build of the lanes runtime and its tests (OpenMP off: libgomp is not
# instrumented and would report false races).
TSAN_FLAGS := -std=c11 -D_GNU_SOURCE -O1 -g -fsanitize=thread -Isrc -Isrc/core -Wall -Wextra -Wno-unused-parameter
tsan:
	@mkdir -p $(BUILD)/tsan
	$(CC) $(TSAN_FLAGS) -o $(BUILD)/tsan/test_lanes tests/test_lanes.c src/lanes/lanes_cpu.c \
	    src/lanes/trace.c src/io/atomic.c src/core/core.c -lpthread -lm
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" $(BUILD)/tsan/test_lanes

# AddressSanitizer + UndefinedBehaviorSanitizer build of everything but CUDA: any report aborts
# (-fno-sanitize-recover), so a test that trips one fails.
ASAN_BUILD ?= build-asan
ASAN_SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=undefined
asan:
	$(MAKE) BUILD=$(ASAN_BUILD) NB_CUDA=0 OPT="-O1 -g -fno-omit-frame-pointer -march=x86-64-v2" \
	    SANITIZE="$(ASAN_SANITIZE)" all

# make install [PREFIX=/usr/local]: the binary, and the data fetched so far (scripts/fetch_data.sh)
# where the installed binary looks for data/ paths (PREFIX/share/nobubble/data, see core/datapath.h)
PREFIX ?= /usr/local
install: $(BUILD)/nobubble
	install -D -m 755 $(BUILD)/nobubble $(DESTDIR)$(PREFIX)/bin/nobubble
	@if [ -d data ]; then mkdir -p $(DESTDIR)$(PREFIX)/share/nobubble/data && \
	    cp -rL --preserve=timestamps data/. $(DESTDIR)$(PREFIX)/share/nobubble/data/ && \
	    echo "install: data/ -> $(DESTDIR)$(PREFIX)/share/nobubble/data"; \
	else echo "install: no data/ yet (bash scripts/fetch_data.sh, then make install again; or set NB_DATA_DIR)"; fi

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/nobubble
	rm -rf $(DESTDIR)$(PREFIX)/share/nobubble

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
