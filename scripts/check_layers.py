#!/usr/bin/env python3
"""check_layers.py - fail when a file in src/ includes a layer it may not.

    python3 scripts/check_layers.py [REPO_ROOT]

The rule is docs/DECISIONS.md's "A map of the code": each folder of src/
owns one layer and includes only the layers its row's "may include" column
names ("everything above" is every row above it, "nothing of llmem" is
none). The table is read from that file, so the document and the check
cannot drift apart: change the table and the check follows.

Each #include "..." in src/ is given the folder that owns it:
  - a public header (llmem/NAME.h): the folder in PUBLIC_OWNER below, which
    must list every header in include/llmem (a new header fails the check
    until it is placed in a layer);
  - a private header: the folder it resolves to (next to the including
    file, then along the relative path, then src/core, the one private
    include directory every file has).
A private header of another folder is a crossing even when it points
downward; the ones we keep are in PRIVATE_CROSSINGS with their reasons
(the same list as DECISIONS.md). Prints one line per violation and exits 1,
or prints a summary and exits 0.
"""
import os
import re
import sys

# The layer of every public header: the folder whose files implement it.
PUBLIC_OWNER = {
    "status.h": "core", "stats.h": "core", "version.h": "core", "outfile.h": "core", "stage.h": "core",
    "resource.h": "resource", "resource_impl.h": "resource", "os_resource.h": "resource",
    "sim_resource.h": "resource", "cuda_resource.h": "resource", "limit_resource.h": "resource",
    "fault_resource.h": "resource", "tracking_resource.h": "resource", "fence.h": "resource",
    "arena.h": "pools", "fixed.h": "pools", "pool.h": "pools", "profile.h": "pools", "multipool.h": "pools",
    "kv.h": "kv",
    "model.h": "model", "shape.h": "model", "quant.h": "model", "synth.h": "model", "tokenizer.h": "model",
    "planner.h": "plan", "predictor.h": "plan",
    "engine.h": "engine", "sampler.h": "engine", "workload.h": "engine",
    "controller.h": "control", "timeline.h": "control", "memctl.h": "control",
    "sched.h": "sched", "step_model.h": "sched",
    "trace.h": "replay", "replay.h": "replay",
    "openai.h": "serve", "server.h": "serve",
    # The umbrella header: the layers of the headers it includes (read from
    # it), so only a folder that may include all of them may include it.
    "llmem.h": None,
    "pmr.hpp": "pools",
}

# Private headers included from another folder, and why each stays.
PRIVATE_CROSSINGS = {
    ("engine", "model/quant_internal.h"): "the block layouts as C structs, for the kernels",
    ("engine", "model/model_release.h"): "a mapped tensor's pages given back after repacking",
    ("pools", "resource/resource_internal.h"): "the pool maps through the os resource's aligned mmap",
    ("shim", "pools/pool_shim.h"): "the shim runs its own copy of the pool",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_table(root):
    """Folder -> the set of folders it may include, from DECISIONS.md."""
    text = open(os.path.join(root, "docs", "DECISIONS.md"), encoding="utf-8").read()
    start = text.index("## A map of the code")
    rows = re.findall(r"^\| `src/([a-z]+)` \|[^|]*\| ([^|]+) \|\s*$", text[start:], re.M)
    if not rows:
        sys.exit("check_layers: no table rows under 'A map of the code' in docs/DECISIONS.md")
    allowed, above = {}, []
    for folder, may in rows:
        may = may.strip()
        if may == "everything above":
            allowed[folder] = set(above)
        elif may == "nothing of llmem":
            allowed[folder] = set()
        else:
            allowed[folder] = {m.strip() for m in may.split(",")}
        above.append(folder)
    return allowed


def owner_of(root, src_file, inc):
    """(folder, folder/name) that owns the header `inc` included by src_file."""
    if inc.startswith("llmem/"):
        name = inc[len("llmem/"):]
        if name not in PUBLIC_OWNER:
            return "?", inc
        return PUBLIC_OWNER[name], inc
    here = os.path.dirname(src_file)
    for base in (here, os.path.join(root, "src", "core")):
        path = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(path):
            rel = os.path.relpath(path, os.path.join(root, "src"))
            return rel.split(os.sep)[0], rel.replace(os.sep, "/")
    # Only the shim has another private include directory (src/pools).
    path = os.path.join(root, "src", "pools", inc)
    if os.path.isfile(path):
        return "pools", "pools/" + inc
    return "?", inc


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    allowed = read_table(root)
    bad = []
    for name in sorted(os.listdir(os.path.join(root, "include", "llmem"))):
        if name not in PUBLIC_OWNER:
            bad.append(f"include/llmem/{name}: not placed in a layer (scripts/check_layers.py PUBLIC_OWNER)")
    umbrella_text = open(os.path.join(root, "include", "llmem", "llmem.h"), encoding="utf-8").read()
    umbrella = {PUBLIC_OWNER.get(i[len("llmem/"):], "?") for i in INCLUDE.findall(umbrella_text)}
    files, used = 0, set()
    for folder in sorted(os.listdir(os.path.join(root, "src"))):
        fdir = os.path.join(root, "src", folder)
        if not os.path.isdir(fdir):
            continue
        if folder not in allowed:
            bad.append(f"src/{folder}: no row in docs/DECISIONS.md's map of the code")
            continue
        for fname in sorted(os.listdir(fdir)):
            if not fname.endswith((".c", ".h")):
                continue
            files += 1
            path = os.path.join(fdir, fname)
            for inc in INCLUDE.findall(open(path, encoding="utf-8").read()):
                owner, rel = owner_of(root, path, inc)
                where = f"src/{folder}/{fname}"
                if owner == "?":
                    bad.append(f"{where}: includes \"{inc}\", which no layer owns")
                elif owner is None:
                    over = sorted(umbrella - allowed[folder] - {folder})
                    if over:
                        bad.append(f"{where}: includes \"{inc}\", which reaches src/{', src/'.join(over)}")
                elif owner != folder and owner not in allowed[folder]:
                    bad.append(f"{where}: includes \"{inc}\" of src/{owner}, which src/{folder} may not include")
                elif owner not in (folder, "core") and not inc.startswith("llmem/"):
                    if (folder, rel) in PRIVATE_CROSSINGS:
                        used.add((folder, rel))
                    else:
                        bad.append(f"{where}: includes src/{rel}, a private header of src/{owner}")
    for folder, rel in sorted(set(PRIVATE_CROSSINGS) - used):
        bad.append(f"PRIVATE_CROSSINGS: src/{folder} no longer includes src/{rel}: remove the entry")
    for line in bad:
        print(line)
    if bad:
        print(f"check_layers: {len(bad)} violation(s) of docs/DECISIONS.md's map of the code")
        return 1
    print(f"check_layers: {files} files in src/, every include goes down the map "
          f"({len(PRIVATE_CROSSINGS)} private crossings allowed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
