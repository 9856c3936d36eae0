# llmem - top-level entry points. CMake does the building; this file only
# chooses build folders and options, and installs missing Debian packages.
#
#   make          build/llmem, build/libllmem.a, build/libllmem.so
#   make demo     the main job: build, then run `llmem demo`
#   make check    all tests: normal build, ASan+UBSan build, TSan for threaded tests
#   make bench    the benchmarks, results on stdout
#   make fuzz     coverage-guided fuzzing with libFuzzer (clang), FUZZ_SECONDS each
#   make deps     install the Debian packages everything needs
#   make install  cmake --install build (PREFIX=/usr/local)

JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local
CMAKE_FLAGS ?=
CTEST = ctest --output-on-failure --no-tests=error -j$(JOBS)

# TSan needs a fixed address layout on kernels with high mmap entropy; run
# its tests without ASLR when the kernel lets us.
NOASLR := $(shell setarch "$$(uname -m)" -R true >/dev/null 2>&1 && echo 'setarch $(shell uname -m) -R')

FUZZ_SECONDS ?= 60

.PHONY: all build deps demo check check-normal check-asan check-tsan bench fuzz install clean

all: build

build:
	@scripts/deps.sh build
	@cmake -S . -B build $(CMAKE_FLAGS) >/dev/null
	@cmake --build build -j$(JOBS)

deps:
	@scripts/deps.sh build test bench

demo:
	@scripts/deps.sh build
	@cmake -S . -B build $(CMAKE_FLAGS) >/dev/null
	@cmake --build build -j$(JOBS) --target llmem_tool >/dev/null
	@build/llmem demo

check: check-normal check-asan check-tsan
	@echo "make check: all test suites passed"

check-normal:
	@scripts/deps.sh test
	cmake -S . -B build -DLLMEM_WERROR=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build -j$(JOBS)
	cd build && $(CTEST)

check-asan:
	@scripts/deps.sh test
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DLLMEM_SANITIZE=address -DLLMEM_WERROR=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 $(CTEST) -LE install

check-tsan:
	@scripts/deps.sh test
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMEM_SANITIZE=thread -DLLMEM_WERROR=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build-tsan -j$(JOBS) --target test_fixed_threads test_resource_threads test_pool_threads test_kv_threads test_threads test_controller_threads
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 $(NOASLR) $(CTEST) -L threads

bench: build
	@scripts/deps.sh bench
	build/llmem bench pools

# Each fuzz target runs for FUZZ_SECONDS on a copy of its corpus (new inputs
# stay in build-fuzz/corpus; add the interesting ones to fuzz/corpus).
fuzz:
	@scripts/deps.sh fuzz
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DLLMEM_SANITIZE=address -DLLMEM_FUZZ=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build-fuzz -j$(JOBS) --target fuzz_trace_lf fuzz_shape_lf fuzz_kv_lf fuzz_model_lf fuzz_tokenizer_lf test_model
	@mkdir -p build-fuzz/corpus/model && LLMEM_WRITE_MODEL_SEEDS=build-fuzz/corpus/model build-fuzz/tests/test_model
	@for t in trace shape kv model tokenizer; do \
	    mkdir -p build-fuzz/corpus/$$t && cp -n fuzz/corpus/$$t/* build-fuzz/corpus/$$t/ ; \
	    echo "fuzz_$$t: $(FUZZ_SECONDS) s"; \
	    build-fuzz/fuzz/fuzz_$${t}_lf -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	        -artifact_prefix=build-fuzz/ build-fuzz/corpus/$$t \
	        >build-fuzz/fuzz_$$t.log 2>&1 || { tail -40 build-fuzz/fuzz_$$t.log; exit 1; }; \
	    grep -E "^(Done|stat::new_units)" build-fuzz/fuzz_$$t.log; \
	done

install: build
	cmake --install build --prefix $(PREFIX)

clean:
	rm -rf build build-asan build-tsan build-fuzz
