#!/usr/bin/python3
"""programs.py - real programs from Debian under each allocator, side by side.

    bench/programs.sh [--rounds N] [--only redis,gcc,python,sqlite] [--json FILE]
                      [--peers jemalloc,mimalloc,tcmalloc] [--base-shim OTHER.so]

(programs.sh builds what is needed, then runs this under /usr/bin/python3.)

With --base-shim, a second build of the shim runs beside the first as
llmem-base (before and after a change, side by side); --peers "" leaves
the three peers out.

Allocators: glibc (no preload; for redis-server, which Debian links with
jemalloc, a preload that hands every call to glibc's __libc_malloc:
bench/glibc_malloc.c), jemalloc, mimalloc, tcmalloc (Debian's shared
libraries, LD_PRELOAD) and llmem (build/libllmem-malloc.so, LD_PRELOAD).

Programs, each with a check of its own results:
  redis   redis-server under redis-benchmark (mimalloc's paper workload:
          LPUSH of 10 items with a random list key space, -P 16, then
          SET/GET/INCR/SADD/HSET with 100-byte values); the client runs on
          glibc. Checked: a scripted redis-cli session's replies equal
          glibc's. Wall time of the benchmark; peak RSS of the server.
  gcc     make -j2 of four of this project's sources at -O2 -g (make, the
          gcc driver, cc1 and as all under the allocator). Checked: the
          object files are byte-identical to glibc's.
  python  /usr/bin/python3 -m test on part of CPython's own test suite
          (Debian's libpython3.11-testsuite). Checked: "Tests result:
          SUCCESS".
  sqlite  sqlite3 on a generated workload (inserts, an index, updates,
          deletes, joins, group by). Checked: output equal to glibc's.

Rounds are interleaved (each round runs every allocator once per program,
the allocator order rotating from round to round) and medians reported:
absolute times on a shared machine are noise, ratios measured side by side
are not. Peak RSS is the largest resident set of the program's processes
(wait4's ru_maxrss; VmHWM for the redis server).
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

LIBDIR = "/usr/lib/x86_64-linux-gnu"
PEERS = {
    "jemalloc": LIBDIR + "/libjemalloc.so.2",
    "mimalloc": LIBDIR + "/libmimalloc.so.2",
    "tcmalloc": LIBDIR + "/libtcmalloc_minimal.so.4",
}
PY_TESTS = ["test_re", "test_dict", "test_list", "test_collections", "test_string"]
GCC_SOURCES = ["src/pools/pool.c", "src/kv/kv.c", "src/engine/engine.c", "src/model/gguf.c"]


def env_for(preload):
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    if preload:
        e["LD_PRELOAD"] = preload
    return e


class Sample:
    """One run: wall seconds, CPU seconds (user + system, the program's
    processes), peak RSS in KiB, and a digest of its results."""
    def __init__(self, wall, cpu, rss, digest):
        self.wall, self.cpu, self.rss, self.digest = wall, cpu, rss, digest


def run_timed(cmd, preload, stdin=None, **kw):
    """Run cmd to completion: (wall s, CPU s, peak RSS KiB of it and its children, output, rc)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env_for(preload), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         **kw)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss, out, p.returncode


def proc_cpu(pid):
    """CPU seconds (user + system) a live process has used."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def redis_script():
    lines = []
    for i in range(1500):
        lines.append("SET key:%d value-%d" % (i, i * 7))
        lines.append("APPEND key:%d -%s" % (i, "x" * (i % 50)))
        lines.append("LPUSH list:%d %s" % (i % 30, " ".join(str(j) for j in range(i % 7 + 1))))
        lines.append("HSET hash:%d f%d %d" % (i % 40, i, i * i))
    for i in range(0, 1500, 7):
        lines.append("GET key:%d" % i)
        lines.append("STRLEN key:%d" % i)
    for i in range(30):
        lines.append("LRANGE list:%d 0 20" % i)
        lines.append("LLEN list:%d" % i)
    for i in range(40):
        lines.append("HLEN hash:%d" % i)
        lines.append("HGET hash:%d f%d" % (i, i))
    return "\n".join(lines) + "\n"


class Bench:
    def __init__(self, args):
        self.a = args
        self.work = args.work
        self.src = args.source

    # ---- programs -----------------------------------------------------
    def redis(self, name, preload):
        port = free_port()
        log = os.path.join(self.work, "redis-%s.log" % name)
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--logfile", log, "--dir", self.work],
            env=env_for(preload), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cli = ["redis-cli", "-p", str(port)]
        for _ in range(200):
            if subprocess.run(cli + ["ping"], capture_output=True).stdout.strip() == b"PONG":
                break
            time.sleep(0.02)
        else:
            server.kill()
            raise RuntimeError("redis-server did not start under %s" % name)
        c0 = proc_cpu(server.pid)
        t0 = time.perf_counter()
        bench = ["redis-benchmark", "-p", str(port), "-q"]
        r1 = subprocess.run(bench + ["-r", "1000000", "-n", str(self.a.redis_n), "-P", "16",
                                     "lpush", "a", "1", "2", "3", "4", "5", "lrange", "a", "1", "10"],
                            capture_output=True, env=env_for(None))
        r2 = subprocess.run(bench + ["-n", str(self.a.redis_n // 3), "-P", "16", "-d", "100", "-r", "100000",
                                     "-t", "set,get,incr,sadd,hset"], capture_output=True, env=env_for(None))
        secs = time.perf_counter() - t0
        cpu = proc_cpu(server.pid) - c0
        check = subprocess.run(cli, input=redis_script().encode(), capture_output=True)
        with open("/proc/%d/status" % server.pid) as f:
            hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
        subprocess.run(cli + ["shutdown", "nosave"], capture_output=True)
        server.wait(timeout=30)
        ok = r1.returncode == 0 and r2.returncode == 0 and b"requests per second" in r2.stdout
        return Sample(secs, cpu, hwm, hashlib.sha256(check.stdout).hexdigest() if ok else "benchmark failed")

    def gcc(self, name, preload):
        d = os.path.join(self.work, "gcc")
        out = os.path.join(d, "out")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        secs, cpu, rss, log, rc = run_timed(["make", "-s", "-j2", "-B", "-C", d, "OUT=" + out], preload)
        if rc != 0:
            return Sample(secs, cpu, rss, "make failed: " + log.decode(errors="replace")[-500:])
        h = hashlib.sha256()
        for f in sorted(os.listdir(out)):
            with open(os.path.join(out, f), "rb") as fh:
                h.update(f.encode() + fh.read())
        return Sample(secs, cpu, rss, h.hexdigest())

    def python(self, name, preload):
        secs, cpu, rss, out, rc = run_timed(["/usr/bin/python3", "-m", "test", "-q"] + PY_TESTS, preload,
                                            cwd=self.work)
        ok = rc == 0 and b"Tests result: SUCCESS" in out
        return Sample(secs, cpu, rss, "SUCCESS" if ok else "python tests failed: " + out.decode(errors="replace")[-800:])

    def sqlite(self, name, preload):
        with open(os.path.join(self.work, "sqlite.sql"), "rb") as f:
            secs, cpu, rss, out, rc = run_timed(["sqlite3", ":memory:"], preload, stdin=f)
        return Sample(secs, cpu, rss, hashlib.sha256(out).hexdigest() if rc == 0 else "sqlite3 failed")

    # ---- set-up -------------------------------------------------------
    def prepare(self):
        os.makedirs(self.work, exist_ok=True)
        d = os.path.join(self.work, "gcc")
        os.makedirs(d, exist_ok=True)
        objs = " ".join("$(OUT)/%s.o" % os.path.basename(s)[:-2] for s in GCC_SOURCES)
        rules = "".join("$(OUT)/%s.o: %s\n\t$(CC) $(CFLAGS) -c $< -o $@\n" % (os.path.basename(s)[:-2],
                                                                            os.path.join(self.src, s))
                        for s in GCC_SOURCES)
        with open(os.path.join(d, "Makefile"), "w") as f:
            f.write("CC = gcc\nCFLAGS = -O2 -g -std=c11 -D_GNU_SOURCE -fPIC -I%s/include -I%s/src/core "
                    "-I%s/src/pools -I/usr/include/cjson\nall: %s\n%s" % (self.src, self.src, self.src, objs, rules))
        sql = ["CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, v TEXT, w BLOB);",
               "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < %d) "
               "INSERT INTO t SELECT i, (i * 7919) %% 5000, printf('value-%%08d', i) || substr(hex(i * 2654435761), 1, i %% 17), "
               "zeroblob(i %% 300) FROM c;" % self.a.sqlite_rows,
               "CREATE INDEX t_k ON t(k);",
               "CREATE TABLE u AS SELECT k, group_concat(v, ',') AS vs, count(*) AS n FROM t GROUP BY k;",
               "SELECT count(*), sum(k), sum(length(v)), sum(length(w)) FROM t;",
               "UPDATE t SET v = v || v || v WHERE k % 3 = 0;",
               "DELETE FROM t WHERE k % 7 = 1;",
               "SELECT count(*), sum(length(v)) FROM t;",
               "SELECT u.k, u.n, length(u.vs), count(t.id) FROM u JOIN t ON t.k = u.k WHERE u.k < 40 GROUP BY u.k ORDER BY u.k;",
               "SELECT k, max(v), min(v) FROM t GROUP BY k ORDER BY k DESC LIMIT 20;",
               "SELECT count(DISTINCT substr(v, 1, 12)) FROM t;",
               "VACUUM;",
               "SELECT count(*) FROM t WHERE v LIKE '%5%';"]
        with open(os.path.join(self.work, "sqlite.sql"), "w") as f:
            f.write("\n".join(sql) + "\n")

    def main(self):
        self.prepare()
        programs = [p for p in ["redis", "gcc", "python", "sqlite"] if p in self.a.only]
        peers = [n for n in self.a.peers.split(",") if n]
        for n in peers:
            if n not in PEERS:
                sys.exit("programs.py: unknown peer %s (known: %s)" % (n, ", ".join(PEERS)))
        allocs = [("glibc", None)] + [(n, PEERS[n]) for n in peers] + \
                 ([("llmem-base", self.a.base_shim)] if self.a.base_shim else []) + [("llmem", self.a.shim)]
        for n, path in allocs:
            if path and not os.path.exists(path):
                sys.exit("programs.py: %s is missing (%s): scripts/deps.sh bench" % (n, path))
        res = {p: {n: [] for n, _ in allocs} for p in programs}
        digests = {p: {n: set() for n, _ in allocs} for p in programs}
        for r in range(self.a.rounds):
            order = allocs[r % len(allocs):] + allocs[:r % len(allocs)]
            for p in programs:
                for n, path in order:
                    preload = self.a.glibc_preload if (p == "redis" and n == "glibc") else path
                    x = getattr(self, p)(n, preload)
                    res[p][n].append((x.wall, x.cpu, x.rss))
                    digests[p][n].add(x.digest)
                    print("round %d %-6s %-8s wall %7.3f s  cpu %7.3f s  rss %8d KiB" % (r + 1, p, n, x.wall, x.cpu, x.rss),
                          file=sys.stderr, flush=True)
        # Every allocator's results must equal glibc's, which must agree with themselves.
        failures = []
        for p in programs:
            ref = digests[p]["glibc"]
            if len(ref) != 1:
                failures.append("%s: glibc's own results differ between rounds: %s" % (p, sorted(ref)))
            for n, _ in allocs:
                if digests[p][n] != ref:
                    failures.append("%s under %s: results differ from glibc's: %s" % (p, n, sorted(digests[p][n])))
        return self.report(programs, [n for n, _ in allocs], res, failures)

    def report(self, programs, names, res, failures):
        def med(p, n, i):
            return statistics.median(x[i] for x in res[p][n])
        print("Medians of %d interleaved rounds: wall s / CPU s / peak RSS MiB." % self.a.rounds)
        print()
        print("| program | " + " | ".join(names) + " | llmem/glibc wall | llmem/best peer wall | llmem/glibc CPU | "
              "llmem/glibc RSS |")
        print("|---|" + "---|" * (len(names) + 4))
        summary = {}
        for p in programs:
            peers = [n for n in names if not n.startswith("llmem")]
            best = min(peers, key=lambda n: med(p, n, 0))
            r = {"wall_vs_glibc": med(p, "llmem", 0) / med(p, "glibc", 0),
                 "wall_vs_best": med(p, "llmem", 0) / med(p, best, 0), "best": best,
                 "cpu_vs_glibc": med(p, "llmem", 1) / med(p, "glibc", 1),
                 "rss_vs_glibc": med(p, "llmem", 2) / med(p, "glibc", 2)}
            summary[p] = r
            cells = ["%.2f / %.2f / %.1f" % (med(p, n, 0), med(p, n, 1), med(p, n, 2) / 1024) for n in names]
            print("| %s | %s | %.3f | %.3f (%s) | %.3f | %.3f |" % (p, " | ".join(cells), r["wall_vs_glibc"],
                                                                   r["wall_vs_best"], best, r["cpu_vs_glibc"],
                                                                   r["rss_vs_glibc"]))
        geo = math.exp(sum(math.log(summary[p]["wall_vs_best"]) for p in programs) / len(programs))
        print()
        print("geometric mean of llmem / best peer (wall): %.3f" % geo)
        print("results checked against glibc's: %s" % ("all equal" if not failures else "%d FAILURES" % len(failures)))
        for f in failures:
            print("FAIL " + f)
        if self.a.json:
            with open(self.a.json, "a") as f:
                f.write(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rounds": self.a.rounds,
                                    "summary": summary, "raw_wall_cpu_rss": res, "geomean_wall_vs_best": geo,
                                    "failures": failures}) + "\n")
        return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shim", required=True)
    ap.add_argument("--glibc-preload", required=True)
    ap.add_argument("--source", required=True, help="the llmem checkout (gcc compiles its sources)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--peers", default="jemalloc,mimalloc,tcmalloc",
                    help="comma-separated peers beside glibc (\"\" for none)")
    ap.add_argument("--base-shim", help="another libllmem-malloc.so, run as llmem-base (an A/B of two builds)")
    ap.add_argument("--only", default="redis,gcc,python,sqlite")
    ap.add_argument("--redis-n", type=int, default=100000)
    ap.add_argument("--sqlite-rows", type=int, default=100000)
    ap.add_argument("--json", help="append the run's figures to this file (one JSON object per line)")
    sys.exit(Bench(ap.parse_args()).main())


if __name__ == "__main__":
    main()
