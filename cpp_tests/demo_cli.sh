#!/bin/sh
# The operator CLI on a store written by the demo (issue 12): runs the C++ main job with
# --keep, then every mws command on the kept store; flips one payload byte and checks
# that `mws verify` fails naming the fragment. Usage: demo_cli.sh DEMO MWS SCRATCH
set -eu
demo=$1 mws=$2 scratch=$3
rm -rf "$scratch" "$scratch.serving-placement.json"
"$demo" --size-mib 16 --threads 2 --keep --dir "$scratch" >/dev/null
key=$("$mws" --dir "$scratch" ls | awk '/committed/ {print $1; exit}')
[ -n "$key" ] || { echo "mws ls shows no committed revision" >&2; "$mws" --dir "$scratch" ls >&2; exit 1; }
echo "committed revision: $key"
"$mws" --dir "$scratch" inspect "$key" | grep -q "fragment "
"$mws" --dir "$scratch" inspect "$key" --json | grep -q '"manifest_digest"'
"$mws" --dir "$scratch" verify "$key" | grep -q '^ok:'
"$mws" --dir "$scratch" gc --dry-run >/dev/null
"$mws" --dir "$scratch" plan "$key" --target "$scratch.serving-placement.json" | grep -q "per target participant"
echo "ls, inspect, verify, gc --dry-run, plan: ok"
# One flipped byte in the largest payload: verify fails and names the fragment.
victim=$(find "$scratch/objects" -path '*/d.payload/*' -type f -size +64k -printf '%s %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
[ -n "$victim" ] || { echo "no payload file found" >&2; exit 1; }
size=$(stat -c %s "$victim")
off=$((size / 2))
byte=$(dd if="$victim" bs=1 skip="$off" count=1 2>/dev/null | od -An -tu1 | tr -d ' ')
printf "$(printf '\\%03o' $(( (byte + 1) % 256 )))" | dd of="$victim" bs=1 seek="$off" count=1 conv=notrunc 2>/dev/null
set +e
out=$("$mws" --dir "$scratch" verify "$key")
rc=$?
set -e
[ "$rc" -eq 1 ] || { echo "mws verify exited $rc on a flipped byte: $out" >&2; exit 1; }
echo "$out" | grep -q "FAIL fragment" || { echo "mws verify did not name the fragment: $out" >&2; exit 1; }
echo "flipped byte: $(echo "$out" | grep -m1 'FAIL fragment')"
rm -rf "$scratch" "$scratch.serving-placement.json"
echo "demo + mws: ok"
