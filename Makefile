# Convenience targets; CMake does the work. `make help` lists them.
JOBS ?= 2
BUILD ?= build
CMAKE_ARGS ?=

SOURCE_DIRS := $(wildcard core formats devices collectives parallel include examples bench tests)
SOURCES = $(shell find $(SOURCE_DIRS) -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \))

.PHONY: help build test test-quick demo bench format gpu-check clean mutants

help:
	@echo "make build      configure (Release) and build $(BUILD)/"
	@echo "make test       the whole suite: format, build, ctest, ASan/UBSan, TSan, bench smoke"
	@echo "make test-quick the suite without the sanitizer builds"
	@echo "make demo       build and run the linreg example"
	@echo "make bench      run meshwit-bench, writing $(BUILD)/bench.json and $(BUILD)/bench.csv"
	@echo "make format     clang-format -i every source file"
	@echo "make gpu-check  on a GPU machine: scripts/gpu-check.sh (CUDA+MPI build, GPU suites, NCCL over MPI, GPU bench)"
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

# On a GPU machine: scripts/gpu-check.sh (run `scripts/gpu-check.sh --prepare` beforehand where apt
# works, so the packages travel with the tree). Bounded to 560 s; results in $(GPU_CHECK_OUT).
GPU_CHECK_OUT ?= build-gpu-check

gpu-check:
	bash scripts/gpu-check.sh $(GPU_CHECK_OUT)

clean:
	rm -rf build build-asan build-tsan build-gpu build-gpu-deps build-gpu-check build-mutants
