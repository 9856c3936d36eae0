# llmem - top-level entry points. CMake does the building; this file only
# chooses build folders and options, and installs missing Debian packages.
#
#   make          build/llmem, build/libllmem.a, build/libllmem.so
#   make demo     the main job: build, then run `llmem demo`
#   make check    all tests: normal build, ASan+UBSan build, TSan for threaded tests
#   make bench    the benchmarks, results on stdout
#   make bench-programs  redis, gcc, python3, sqlite3 under each malloc (bench/programs.sh)
#   make fuzz     coverage-guided fuzzing with libFuzzer (clang), FUZZ_SECONDS each
#   make check-fuzz  the same, 20 s per target (part of make check)
#   make soak     SOAK_MINUTES (30) of bursts under the controller: RSS drift and leaks;
#                 first the thread stress for SOAK_STRESS_SECONDS (60)
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
# Every libFuzzer target, by corpus name (fuzz/fuzz_<t>.c, fuzz/corpus/<t>).
FUZZ_TARGETS = trace shape kv model tokenizer pool fixed arena sched oai
SOAK_MINUTES ?= 30
SOAK_STRESS_SECONDS ?= 60

.PHONY: all build deps demo check check-normal check-asan check-tsan check-fuzz bench bench-programs fuzz soak install clean

all: build

build:
	@scripts/deps.sh build
	@cmake -S . -B build $(CMAKE_FLAGS) >/dev/null
	@cmake --build build -j$(JOBS)

deps:
	@scripts/deps.sh build test bench

# The demo needs only the build packages: the tests are configured when
# cmocka is there (LLMEM_BUILD_TESTS=AUTO), never required.
demo:
	@scripts/deps.sh build
	@cmake -S . -B build $(CMAKE_FLAGS) >/dev/null
	@cmake --build build -j$(JOBS) --target llmem_tool >/dev/null
	@build/llmem demo --timeline build/demo-timeline.html

check: check-normal check-asan check-tsan check-fuzz
	@echo "make check: all test suites passed"

# The normal build runs the suite with the shared folder hidden
# (LLMEM_SHARED_DIR=an empty folder), so every run exercises what a clone
# without ../shared sees: the shared-data tests (label "shared") must say
# Skipped. Then it runs those tests again with the real folder (they skip
# again when there is none). The other builds see the real folder.
check-normal:
	@scripts/deps.sh test
	cmake -S . -B build -DLLMEM_BUILD_TESTS=ON -DLLMEM_WERROR=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build -j$(JOBS)
	@rm -rf build/no-shared && mkdir -p build/no-shared
	cd build && LLMEM_SHARED_DIR=$(CURDIR)/build/no-shared $(CTEST) --output-junit ctest-no-shared.xml; \
	    rc=$$?; ../tests/skip_summary.sh ctest-no-shared.xml; exit $$rc
	cd build && $(CTEST) -L shared --output-junit ctest-shared.xml; rc=$$?; ../tests/skip_summary.sh ctest-shared.xml; exit $$rc

# ASan+UBSan at -O1 (what the sanitizers' authors advise): every check,
# about three times faster than -O0 (the ASan demo: 45 s, not 158 s).
ASAN_OPT = "-DCMAKE_C_FLAGS_DEBUG=-g -O1" "-DCMAKE_CXX_FLAGS_DEBUG=-g -O1"

check-asan:
	@scripts/deps.sh test
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug $(ASAN_OPT) -DLLMEM_SANITIZE=address -DLLMEM_BUILD_TESTS=ON -DLLMEM_WERROR=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 $(CTEST) -LE install \
	    --output-junit ctest.xml; rc=$$?; ../tests/skip_summary.sh ctest.xml; exit $$rc

check-tsan:
	@scripts/deps.sh test
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMEM_SANITIZE=thread -DLLMEM_BUILD_TESTS=ON -DLLMEM_WERROR=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build-tsan -j$(JOBS) --target test_fixed_threads test_resource_threads test_pool_threads test_kv_threads test_threads test_controller_threads test_sched_threads test_stress_threads test_fence test_pool_lcache llmem_tool
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 $(NOASLR) $(CTEST) -L threads \
	    --output-junit ctest.xml; rc=$$?; ../tests/skip_summary.sh ctest.xml; exit $$rc

bench: build
	@scripts/deps.sh bench
	build/llmem bench pools

# Real programs from Debian under glibc, jemalloc, mimalloc, tcmalloc and
# libllmem-malloc.so, side by side (a few minutes; docs/BENCHMARKS.md).
bench-programs: build
	bench/programs.sh --rounds 5

# Each fuzz target runs for FUZZ_SECONDS on a copy of its corpus (new inputs
# stay in build-fuzz/corpus; add the interesting ones to fuzz/corpus). Each
# target's libFuzzer output goes to build-fuzz/fuzz_<t>.log, one line per
# target to the terminal, and "target execs seconds new_units" lines to
# build-fuzz/fuzz-summary.txt. A crash fails the target and names the input
# that caused it (build-fuzz/crash-*): copy it into fuzz/corpus/<t>/ as a
# regression once fixed.
fuzz:
	@scripts/deps.sh fuzz
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DLLMEM_SANITIZE=address -DLLMEM_FUZZ=ON -DLLMEM_BUILD_TESTS=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build-fuzz -j$(JOBS) --target $(patsubst %,fuzz_%_lf,$(FUZZ_TARGETS)) test_model test_tokenizer test_debug
	@build-fuzz/tests/test_debug >build-fuzz/test_debug.log 2>&1 || { cat build-fuzz/test_debug.log; exit 1; }
	@sed -n 's/^# //p' build-fuzz/test_debug.log | head -1
	@mkdir -p build-fuzz/corpus/model && LLMEM_WRITE_MODEL_SEEDS=build-fuzz/corpus/model build-fuzz/tests/test_model
	@mkdir -p build-fuzz/corpus/tokenizer && { LLMEM_WRITE_TOKENIZER_SEEDS=build-fuzz/corpus/tokenizer \
	    build-fuzz/tests/test_tokenizer; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 77 ]; }
	@echo "# target execs seconds new_units (FUZZ_SECONDS=$(FUZZ_SECONDS))" >build-fuzz/fuzz-summary.txt
	@for t in $(FUZZ_TARGETS); do \
	    mkdir -p build-fuzz/corpus/$$t && cp -n fuzz/corpus/$$t/* build-fuzz/corpus/$$t/ ; \
	    build-fuzz/fuzz/fuzz_$${t}_lf -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	        -artifact_prefix=build-fuzz/crash-$$t- build-fuzz/corpus/$$t >build-fuzz/fuzz_$$t.log 2>&1; \
	    rc=$$?; \
	    execs=$$(sed -n 's/^stat::number_of_executed_units: *//p' build-fuzz/fuzz_$$t.log); \
	    secs=$$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' build-fuzz/fuzz_$$t.log); \
	    units=$$(sed -n 's/^stat::new_units_added: *//p' build-fuzz/fuzz_$$t.log); \
	    if [ $$rc -ne 0 ]; then \
	        tail -40 build-fuzz/fuzz_$$t.log; \
	        echo "fuzz_$$t: CRASH (exit $$rc); input: $$(sed -n 's/.*Test unit written to \(.*\)/\1/p' build-fuzz/fuzz_$$t.log)"; \
	        echo "fuzz_$$t crash" >>build-fuzz/fuzz-summary.txt; \
	        exit 1; \
	    fi; \
	    echo "fuzz_$$t: $${execs:-?} execs in $${secs:-?} s, 0 crashes, $${units:-0} new units"; \
	    echo "fuzz_$$t $${execs:-0} $${secs:-0} $${units:-0}" >>build-fuzz/fuzz-summary.txt; \
	done

# CI: every target for 20 s (about three minutes in all).
check-fuzz:
	@scripts/deps.sh fuzz
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=20

# The long runs: the 8-thread stress of pool, fixed pool and KV for
# SOAK_STRESS_SECONDS, then `llmem soak` for SOAK_MINUTES (samples of
# resident memory each second in build/soak-samples.csv, a JSON summary on
# stdout; fails on RSS drift above 2% after warm-up, or on any leak), then
# the serving soak (tests/serve_soak.sh) for as long.
soak:
	@scripts/deps.sh build test
	@cmake -S . -B build -DLLMEM_BUILD_TESTS=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build build -j$(JOBS) --target llmem_tool test_stress_threads >/dev/null
	LLMEM_STRESS_SECONDS=$(SOAK_STRESS_SECONDS) build/tests/test_stress_threads
	build/llmem soak --minutes $(SOAK_MINUTES) --samples build/soak-samples.csv --progress
	sh tests/serve_soak.sh build/llmem $$(( $(SOAK_MINUTES) * 60 ))

install: build
	cmake --install build --prefix $(PREFIX)

clean:
	rm -rf build build-asan build-tsan build-fuzz
