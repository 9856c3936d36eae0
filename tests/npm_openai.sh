#!/bin/sh
# npm_openai.sh DIR - install the official OpenAI client from the npm
# registry into DIR (the build tree; never globally), pinned, once: a
# second call finds it there. Exit 0 when DIR/node_modules/openai is the
# pinned version, 77 (with "skipped: ...") when node, npm or the registry
# is not there, so a test that needs the client shows as Skipped.
set -u
dir=$1
version=4.95.0
command -v node >/dev/null 2>&1 || { echo "skipped: node is not installed (the OpenAI client test needs Node.js)"; exit 77; }
command -v npm >/dev/null 2>&1 || { echo "skipped: npm is not installed (the OpenAI client test needs it)"; exit 77; }
mkdir -p "$dir" || exit 1
dir=$(cd "$dir" && pwd) || exit 1
have=$(node -e "try{console.log(require('$dir/node_modules/openai/package.json').version)}catch(e){}" 2>/dev/null)
[ "$have" = "$version" ] && exit 0
# A lock so parallel test entries install once.
(
    flock 9
    have=$(node -e "try{console.log(require('$dir/node_modules/openai/package.json').version)}catch(e){}" 2>/dev/null)
    [ "$have" = "$version" ] && exit 0
    [ -f "$dir/package.json" ] || echo '{"name":"llmem-test-clients","private":true}' >"$dir/package.json"
    timeout 300 npm install --prefix "$dir" --no-audit --no-fund --save-exact "openai@$version" >"$dir/npm.log" 2>&1
) 9>"$dir/.lock"
have=$(node -e "try{console.log(require('$dir/node_modules/openai/package.json').version)}catch(e){}" 2>/dev/null)
if [ "$have" != "$version" ]; then
    echo "skipped: could not install openai@$version from the npm registry (offline?): $(tail -3 "$dir/npm.log" 2>/dev/null | tr '\n' ' ')"
    exit 77
fi
exit 0
