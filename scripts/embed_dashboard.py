#!/usr/bin/env python3
"""embed_dashboard.py - src/serve/dashboard.html -> src/serve/dashboard.c
(the page as one C string, so the server binary carries it)."""
import os
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
html = open(os.path.join(root, 'src/serve/dashboard.html')).read()
out = ['/*\n * dashboard.c - the page GET / serves (generated from dashboard.html by\n'
       ' * scripts/embed_dashboard.py; edit the .html and run it again). One\n'
       ' * self-contained page: no network but this server.\n */\n#include <stddef.h>\n\n'
       '#include "server_impl.h"\n\n#pragma GCC diagnostic ignored "-Woverlength-strings"\n\nconst char llmem__dashboard_html[] =\n']
for line in html.splitlines(True):
    out.append('    "' + line.replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n') + '"\n')
out.append(';\nconst size_t llmem__dashboard_html_len = sizeof llmem__dashboard_html - 1;\n')
open(os.path.join(root, 'src/serve/dashboard.c'), 'w').write(''.join(out))
