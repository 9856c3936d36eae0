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
 3. two step models (llmem/step_model.h's LINEAR):
    - "own": each configuration's server fitted on the steps it ran
      during the bench (llmem_server_step_model, printed by the bench):
      the cost function of that very run, so the comparison tests the
      simulated scheduler, not how the machine's load moved between runs;
    - "engine" (unless --fit own): `llmem replay --engine` runs the same
      trace (paged) on the real engine afterwards and fits the steps it
      measured: the prediction one can make before serving;
 4. `llmem replay` with each model on the traces: paged, static, and paged
    with the system prompt, prefix cache on and off;
 5. a table of measured, predicted and the error (predicted / measured - 1)
    for each model.

Usage (from the repository root; takes the bench lock itself):
    bench/serve_vs_replay.py --build build --seed 1 [--rate 8] [--budget 8MiB]
        [--requests 48] [--threads 2] [--work DIR] [--fit own|both]
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
        if line.startswith("step model"):
            break  # the per-configuration step models follow the table
        name = line[:22].strip()
        if name in CONFIGS:
            f = line[22:].split()
            row = {}
            for k, v in zip(BENCH_COLS, f):
                row[k] = v if k == "ok" else float(v.rstrip("%"))
            out[name] = row
    return out


def parse_fits(text):
    """The bench's per-configuration step models: name -> 'linear:...'."""
    fits = {}
    for line in text.splitlines():
        m = re.search(r"--step-model (linear:\S+)", line)
        if m and line.startswith("  ") and line[2:24].strip() in CONFIGS:
            fits[line[2:24].strip()] = m.group(1)
    return fits


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
    ap.add_argument("--fit", choices=["own", "both"], default="both")
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
    own = parse_fits(bench_out)
    models = [("own", None)]
    if a.fit == "both":
        # The real engine on the same trace afterwards, its steps fitted.
        eng_out, eng_err = run([llmem, "replay", "--engine", model, "--trace", trace + ".csv", "--strategy", "paged",
                                "--max-prefill", "512"] + common, a.lock)
        m = re.search(r"--step-model (linear:\S+)", eng_out + eng_err)
        if not m:
            sys.exit("serve_vs_replay: no step model in the engine replay's output")
        models.append(("engine", m.group(1)))
        print("step model fitted on the engine's steps of this trace: " + m.group(1))
    rows = []
    for name, (strategy, which, cache) in CONFIGS.items():
        b = meas.get(name)
        if not b:
            sys.exit("serve_vs_replay: no '%s' row in the bench output" % name)
        preds = {}
        for label, fit in models:
            fit = fit or own.get(name)
            if not fit:
                sys.exit("serve_vs_replay: no step model of its own steps for '%s' in the bench output" % name)
            cmd = [llmem, "replay", "--trace", trace + (".csv" if which == "plain" else "-sys.csv"), "--model-shape",
                   "tiny-15m", "--kv-dtype", "f32", "--kv-budget", a.budget, "--max-batch", "32", "--max-prefill",
                   "512", "--strategy", strategy, "--step-model", fit, "--json"] + (["--prefix-cache"] if cache else [])
            out, _ = run(cmd)
            preds[label] = (fit, json.loads(out))
        rows.append((name, b, preds))
    labels = [l for l, _ in models]
    print("\n%-22s %-20s %10s" % ("configuration", "figure", "measured") +
          "".join(" %10s %8s" % ("pred " + l, "error") for l in labels))
    for name, b, preds in rows:
        def figs(p):
            return [("TTFT p50 (ms)", b["ttft50"], 1e3 * p["ttft_p50_s"]),
                    ("TTFT p99 (ms)", b["ttft99"], 1e3 * p["ttft_p99_s"]),
                    ("TPOT p50 (ms)", b["tpot50"], 1e3 * p["tpot_p50_s"]),
                    ("TPOT p99 (ms)", b["tpot99"], 1e3 * p["tpot_p99_s"]),
                    ("E2E p50 (s)", b["e2e50"], p["e2e_p50_s"]), ("E2E p99 (s)", b["e2e99"], p["e2e_p99_s"]),
                    ("mean concurrency", b["seqs_mean"], p["mean_concurrency"]),
                    ("max concurrency", b["running_max"], p["max_concurrency"]),
                    ("KV utilisation (%)", b["kv_util"], 100 * p["kv_utilization"]),
                    ("preemptions", b["preemptions"], p["preemptions"]),
                    ("prefix hit (%)", b["prefix_hit"], 100 * p["prefix_hit_rate"])]
        cols = [figs(preds[l][1]) for l in labels]
        for i, (label, mv, _) in enumerate(cols[0]):
            print("%-22s %-20s %10.3g" % (name, label, mv) +
                  "".join(" %10.3g %8s" % (c[i][2], err(c[i][2], mv)) for c in cols))
    print("\nJSON " + json.dumps({"seed": a.seed, "rate": a.rate, "budget": a.budget,
                                  "rows": [{"config": n, "measured": b,
                                            "predicted": {l: {"fit": f, "replay": p} for l, (f, p) in preds.items()}}
                                           for n, b, preds in rows]}))


if __name__ == "__main__":
    main()
