#!/usr/bin/env bash
# Packs this checkout's code (tracked and new files, without docs/ and test fixtures) into
# .gpu/code/code.tar.gz, which every device call carries and unpacks to /root/sl (the device tool
# sends the session's checkout, which need not be this one). Run from the repository root.
# PACK_BEFORE=COMMIT also packs that commit's code into .gpu/code/before.tar.gz, for before/after
# benchmarks in one call (swarmload bench ... --code before=/root/before --code after=/root/sl).
set -euo pipefail
mkdir -p .gpu/code
{ git ls-files; git ls-files --others --exclude-standard; } | grep -v -e '^docs/' -e '^tests/fixtures/' \
  | sort -u | while read -r f; do [ -f "$f" ] && echo "$f"; done | tar -czf .gpu/code/code.tar.gz -T -
echo ".gpu/code/code.tar.gz: $(du -h .gpu/code/code.tar.gz | cut -f1)"
if [ -n "${PACK_BEFORE:-}" ]; then
  git archive --format=tar "$PACK_BEFORE" -- . ':!docs' ':!tests/fixtures' | gzip > .gpu/code/before.tar.gz
  echo ".gpu/code/before.tar.gz ($PACK_BEFORE): $(du -h .gpu/code/before.tar.gz | cut -f1)"
fi
