#!/usr/bin/env python3
"""long_functions.py LIMIT DIR... - list the C functions in DIR longer than
LIMIT lines (pipe into sort -rn for the longest first). A function is a
top-level '{' at column 0 (or a signature line ending in ') {') to the next
'}' at column 0, as the house style writes them (STYLE.md). Issue 13's bound:

    python3 scripts/long_functions.py 150 src tools   # prints nothing
"""
import sys, re, pathlib
limit = int(sys.argv[1]); roots = sys.argv[2:]
for root in roots:
    for p in sorted(pathlib.Path(root).rglob('*.[ch]')):
        lines = p.read_text(errors='replace').split('\n')
        start = None; name = None
        for i, l in enumerate(lines):
            if start is None:
                if l == '{' or (re.match(r'^[A-Za-z_].*\)\s*\{\s*$', l) and not l.startswith(('typedef','struct','enum','union')) and '=' not in l):
                    # find the signature start
                    j = i
                    while j > 0 and not re.match(r'^[A-Za-z_]', lines[j]): j -= 1
                    while j > 0 and re.match(r'^\s+\S', lines[j]) : j -= 1
                    sig = lines[j] if l == '{' else l
                    if l == '{' and ('(' not in ' '.join(lines[max(0,i-4):i])): continue
                    k = i - 1 if l == '{' else i
                    while k > 0 and not re.match(r'^[A-Za-z_]', lines[k]): k -= 1
                    m = re.search(r'([A-Za-z_][A-Za-z0-9_]*)\s*\(', lines[k])
                    name = m.group(1) if m else '?'; start = i
            elif l.startswith('}'):
                n = i - start + 1
                if n > limit: print(f'{n:5d} {p}:{start+1} {name}')
                start = None
