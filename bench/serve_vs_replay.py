#!/usr/bin/env python3
"""serve_vs_replay.py - `llmem bench serve` (the real server over loopback)
next to what `llmem replay` (the same scheduler, simulated) predicts for the
very same workload (docs/BENCHMARKS.md, "Paged against static where static's
reservation binds").

One run:
 1. a synthetic tiny-15m model (q8_0; `llmem synth`, seeded: the same file
    every time) - big enough that a decode step reads its weights from
    memory, so a step with more sequences costs little more than one with
    few, as on a GPU;
 2. `llmem bench serve` with --write-trace: its four configurations, and the
    arrivals and lengths it sent written as traces;
 3. the step model, as llmem/step_model.h says to calibrate it for a loaded
    machine: `llmem replay --engine` runs the same trace (paged) on the real
    engine and fits the linear model to the steps it measured;
 4. `llmem replay` with that model on the traces: paged, static, and paged
    with the system prompt, prefix cache on and off;
 5. a table of measured, predicted and the error (predicted / measured - 1).

Usage (from the repository root; takes the bench lock itself):
    bench/serve_vs_replay.py --build build --seed 1 [--rate 8] [--budget 8MiB]
        [--requests 48] [--threads 2] [--work DIR]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

BENCH_COLS = ["ok", "ttft50", "ttft99", "tpot50", "tpot99", "e2e50", "e2e99", "tok_s", "kv_mean", "kv_max",
              "kv_util", "running_max", "seqs_mean", "preemptions", "prefix_hit", "rss_mb"]
CONFIGS = {"paged": ("paged", "plain", False), "static": ("static", "plain", False),
           "paged+sys, cache on": ("paged", "sys", True), "paged+sys, cache off": ("paged", "sys", False)}


def run(cmd, lock=None):
    if lock:
        cmd = ["flock", lock] + cmd
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode:
        sys.exit("serve_vs_replay: %s failed (%d):\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    return p.stdout, p.stderr


def parse_bench(text):
    out = {}
    for line in text.splitlines():
        name = line[:22].strip()
        if name in CONFIGS:
            f = line[22:].split()
            row = {}
            for k, v in zip(BENCH_COLS, f):
                row[k] = v if k == "ok" else float(v.rstrip("%"))
            out[name] = row
    return out


def err(pred, meas):
    return "%+.0f%%" % (100 * (pred / meas - 1)) if meas else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--seed", default="1")
    ap.add_argument("--rate", default="8")
    ap.add_argument("--budget", default="8MiB")
    ap.add_argument("--requests", default="48")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--lock", default="/work/bench.lock" if os.path.isdir("/work") else None)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    llmem = os.path.join(a.build, "llmem")
    work = a.work or tempfile.mkdtemp(prefix="serve-vs-replay-")
    model = os.path.join(work, "tiny15m-q8.gguf")
    if not os.path.exists(model):
        run([llmem, "synth", "--shape", "tiny-15m", "--type", "q8_0", "-o", model])
    trace = os.path.join(work, "w-seed%s" % a.seed)
    common = ["--kv-budget", a.budget, "--max-batch", "32", "--threads", a.threads]
    bench_out, _ = run([llmem, "bench", "serve", model, "--requests", a.requests, "--rate", a.rate, "--seed", a.seed,
                        "--write-trace", trace] + common, a.lock)
    print(bench_out)
    meas = parse_bench(bench_out)
    # The step model: the real engine on the same trace, its steps fitted.
    eng_out, eng_err = run([llmem, "replay", "--engine", model, "--trace", trace + ".csv", "--strategy", "paged",
                            "--max-prefill", "512"] + common, a.lock)
    m = re.search(r"--step-model (linear:\S+)", eng_out + eng_err)
    if not m:
        sys.exit("serve_vs_replay: no step model in the engine replay's output")
    fit = m.group(1)
    print("step model fitted on the engine's steps of this trace: " + fit)
    rows = []
    for name, (strategy, which, cache) in CONFIGS.items():
        cmd = [llmem, "replay", "--trace", trace + (".csv" if which == "plain" else "-sys.csv"), "--model-shape",
               "tiny-15m", "--kv-dtype", "f32", "--kv-budget", a.budget, "--max-batch", "32", "--max-prefill", "512",
               "--strategy", strategy, "--step-model", fit, "--json"] + (["--prefix-cache"] if cache else [])
        out, _ = run(cmd)
        p = json.loads(out)
        b = meas.get(name)
        if not b:
            sys.exit("serve_vs_replay: no '%s' row in the bench output" % name)
        rows.append((name, b, p))
    print("\n%-22s %-22s %10s %10s %8s" % ("configuration", "figure", "measured", "predicted", "error"))
    for name, b, p in rows:
        figs = [("TTFT p50 (ms)", b["ttft50"], 1e3 * p["ttft_p50_s"]), ("TTFT p99 (ms)", b["ttft99"], 1e3 * p["ttft_p99_s"]),
                ("TPOT p50 (ms)", b["tpot50"], 1e3 * p["tpot_p50_s"]), ("TPOT p99 (ms)", b["tpot99"], 1e3 * p["tpot_p99_s"]),
                ("E2E p50 (s)", b["e2e50"], p["e2e_p50_s"]), ("E2E p99 (s)", b["e2e99"], p["e2e_p99_s"]),
                ("mean concurrency", b["seqs_mean"], p["mean_concurrency"]),
                ("max concurrency", b["running_max"], p["max_concurrency"]),
                ("KV utilisation (%)", b["kv_util"], 100 * p["kv_utilization"]),
                ("preemptions", b["preemptions"], p["preemptions"]),
                ("prefix hit (%)", b["prefix_hit"], 100 * p["prefix_hit_rate"])]
        for label, mv, pv in figs:
            print("%-22s %-22s %10.3g %10.3g %8s" % (name, label, mv, pv, err(pv, mv)))
    print("\nJSON " + json.dumps({"seed": a.seed, "rate": a.rate, "budget": a.budget, "fit": fit,
                                  "rows": [{"config": n, "measured": b, "predicted": p} for n, b, p in rows]}))


if __name__ == "__main__":
    main()
