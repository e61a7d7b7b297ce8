# Convenience targets; CMake does the work. `make help` lists them.
JOBS ?= 2
GPU_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
CMAKE_ARGS ?=

SOURCE_DIRS := $(wildcard core devices parallel include examples bench tests)
SOURCES = $(shell find $(SOURCE_DIRS) -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \))

.PHONY: help build test test-quick demo bench format gpu-check clean mutants

help:
	@echo "make build      configure (Release) and build $(BUILD)/"
	@echo "make test       the whole suite: format, build, ctest, ASan/UBSan, TSan, bench smoke"
	@echo "make test-quick the suite without the sanitizer builds"
	@echo "make demo       build and run the linreg example"
	@echo "make bench      run meshwit-bench, writing $(BUILD)/bench.json and $(BUILD)/bench.csv"
	@echo "make format     clang-format -i every source file"
	@echo "make gpu-check  on a GPU machine: CUDA build in build-gpu/, gpu tests, GPU bench"
	@echo "make mutants    put each bug of tests/mutants.txt in a scratch copy; its tests must fail"
	@echo "make clean      remove the build directories"

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test:
	bash scripts/test.sh

test-quick:
	bash scripts/test.sh --quick

demo:
	bash scripts/demo.sh

mutants:
	bash scripts/mutants.sh

bench: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target meshwit-bench
	$(BUILD)/meshwit-bench --json $(BUILD)/bench.json --csv $(BUILD)/bench.csv

format:
	$(if $(strip $(SOURCES)),clang-format -i $(SOURCES),@echo "no source files")

# Everything here is bounded so the check finishes within 5 minutes on a GPU machine.
# FP32 peak of the GPU for the MFU column (H100/H200 SXM: 67 TFLOP/s without tensor cores).
GPU_PEAK_TFLOPS ?= 67

gpu-check:
	cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMESHWIT_CUDA=ON $(CMAKE_ARGS)
	cmake --build build-gpu -j $(GPU_JOBS)
	timeout 180 ctest --test-dir build-gpu -L gpu --output-on-failure
	timeout 90 build-gpu/meshwit-bench linreg --devices cuda:0 --devices cuda:0x2
	MESHWIT_PEAK_TFLOPS=$(GPU_PEAK_TFLOPS) timeout 120 build-gpu/meshwit-bench gpt2 --quick \
	    --devices cuda:0 --devices cuda:0x2

clean:
	rm -rf build build-asan build-tsan build-gpu build-mutants
