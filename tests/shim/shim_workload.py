"""shim_workload.py - a deterministic Python workload for tests/shim/programs.sh:
dicts, json, re and sorting, four threads allocating at once, and forks
from the threaded parent whose children allocate and report through a pipe.
Prints the same lines under any allocator."""
import hashlib
import json
import os
import re
import threading

def work(seed, n):
    d = {}
    for i in range(n):
        k = "k%d-%d" % (seed, (i * 7919) % (n // 2 + 1))
        d.setdefault(k, []).append("x" * (i % 300))
    blob = json.dumps(d, sort_keys=True)
    back = json.loads(blob)
    words = re.findall(r"k(\d+)-(\d+)", blob)
    return hashlib.sha256((blob + str(len(words)) + str(len(back))).encode()).hexdigest()

results = {}

def thread_main(seed):
    results[seed] = work(seed, 8000)

threads = [threading.Thread(target=thread_main, args=(s,)) for s in range(4)]
for t in threads:
    t.start()

# Fork while the other threads allocate: the children allocate too.
children = []
for s in range(4):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, work(100 + s, 5000).encode())
        os._exit(0)
    os.close(w)
    children.append((pid, r, s))
for pid, r, s in children:
    out = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        out += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    print("child", s, os.waitstatus_to_exitcode(status), out.decode())

for t in threads:
    t.join()
for s in sorted(results):
    print("thread", s, results[s])
big = sorted(("%07d" % ((i * 2654435761) % 10**7)) for i in range(100000))
print("sorted", big[0], big[-1], hashlib.md5("".join(big).encode()).hexdigest())
