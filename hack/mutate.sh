#!/usr/bin/env bash
# mutate.sh is `make mutate`: mutation testing of the NodeInventory freshness
# filter (shared/inventory/kubeinventory) and the warm pick (shared/inventory).
#
# 1. gremlins mutates every operator the tests cover (boundaries, negations,
#    arithmetic) and must see every covered mutant killed.
# 2. The named mutants below are the changes gremlins cannot make (a call
#    swapped, a store or a filter removed, the shards' join loosened).
#    Each is applied through `go test -overlay`, so the tree is never
#    touched, and must make the tests fail.
#
# Only the unit tests run (SKIFF_MUTATE=1 skips the control-plane test): they
# alone must kill every mutant.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
gremlins="$root/bin/gremlins"
export SKIFF_MUTATE=1

cd "$root/shared"
echo "== gremlins ./inventory (and kubeinventory below it)"
"$gremlins" unleash --workers 2 --threshold-efficacy 100 ./inventory

file="$root/shared/inventory/kubeinventory/source.go"
# name ~ original ~ mutant: the original must occur exactly once in source.go;
# \n and \t in the texts stand for a newline and a tab.
mutants=$(cat <<'MUTANTS'
boundary: exactly StaleAfter behind dropped (<= to <) ~ if d <= s.staleAfter { ~ if d < s.staleAfter {
boundary: one second more kept (window widened by 1s) ~ if d <= s.staleAfter { ~ if d <= s.staleAfter+time.Second {
min against now removed ~ ref := min(newest, s.clock.Now().UnixNano()) ~ ref := newest
max for min ~ ref := min(newest, s.clock.Now().UnixNano()) ~ ref := max(newest, s.clock.Now().UnixNano())
recovery deadline on the cap's clock ~ ref := min(newest, s.clock.Now().UnixNano())\n\tnow := s.local.Now() ~ ref := min(newest, s.clock.Now().UnixNano())\n\tnow := s.clock.Now()
newest by min instead of max ~ newest = max(newest, ts) ~ newest = min(newest, ts)
reference never stored ~ if s.ref.CompareAndSwap(prev, &next) {\n\t\t\treturn next ~ if true {\n\t\t\treturn next
list filter removed ~ if _, ok := s.behind(items[i].PublishedAt, ref, now); ok { ~ if _, ok := s.behind(items[i].PublishedAt, ref, now); ok || true {
lookup filter removed ~ if behind, ok := s.behind(inv.PublishedAt, ref, s.local.Now()); !ok { ~ if behind, ok := s.behind(inv.PublishedAt, ref, s.local.Now()); !ok && false {
lookup reads a zero reference as now ~ ref := s.reference()\n\tif behind ~ ref := s.reference()\n\tref.at = cmp.Or(ref.at, s.clock.Now().UnixNano())\n\tif behind
zero reference not fresh ~ if ref.at == 0 {\n\t\treturn 0, true ~ if ref.at == 0 {\n\t\treturn 0, false
parse error ignored (unreadable read as a stamp) ~ if sec <= 0 || sec >= maxStampSeconds {\n\t\treturn 0, false ~ if sec <= 0 || sec >= maxStampSeconds {\n\t\treturn stamp.UnixNano(), true
missing stamp not an error (nil read as a stamp) ~ if stamp == nil {\n\t\treturn 0, false ~ if stamp == nil {\n\t\treturn 0, true
epoch boundary (<= to <) ~ sec <= 0 || ~ sec < 0 ||
overflow boundary (>= to >) ~ sec >= maxStampSeconds ~ sec > maxStampSeconds
unreadable stamp read as stale ~ if !ok {\n\t\treturn 0, true\n\t}\n\td := ~ if !ok {\n\t\treturn time.Duration(ref.at), false\n\t}\n\td :=
recovery never carried ~ case last.recovering(now) && ref < last.until: ~ case false:
recovery never started ~ next.before, next.until, next.deadline = last.at, ref+int64(s.grace), now.Add(s.grace) ~ _ = last.at
recovery keeps every node ~ return d, ref.recovering(now) && time.Duration(ref.before-ts) <= s.staleAfter ~ return d, ref.recovering(now)
recovery keeps no node ~ return d, ref.recovering(now) && time.Duration(ref.before-ts) <= s.staleAfter ~ return d, false
recovery without its clock deadline ~ return r.until != 0 && r.at < r.until && now.Before(r.deadline) ~ return r.until != 0 && r.at < r.until
Observe does not advance ~ s.advance(list.Items)\n\treturn nil ~ _ = list.Items\n\treturn nil
join keeps a shard naming another node ~ if sh == nil || sh.Spec.Node != inv.Name || int(sh.Spec.Index) != k { ~ if sh == nil || int(sh.Spec.Index) != k {
join keeps a shard naming another index ~ if sh == nil || sh.Spec.Node != inv.Name || int(sh.Spec.Index) != k { ~ if sh == nil || sh.Spec.Node != inv.Name {
join never refreshed (memo kept) ~ || j == nil || !slices.Equal(j.rvs, rvs) || ~ || j == nil || !slices.Equal(j.rvs, j.rvs) ||
join version the last shard's, not the newest ~ newest = max(newest, rv) ~ newest = rv
join version ignores the inventory's own ~ v := max(j.rv, rv) ~ v := max(j.rv, 0*rv)
join version not moved by a late shard ~ v = max(v, prev.returned+1) ~ v = max(v, prev.returned)
join version not remembered ~ j.returned = max(j.returned, v) ~ _ = v
join shares the cache's entries with ListNodes ~ j.sandboxes[i].DeepCopyInto(&all[len(own)+i]) ~ all[len(own)+i] = j.sandboxes[i]
join drops the inventory's own entries ~ copy(all, own) ~ _ = own
join drops the packed entries ~ part, err := sh.Spec.Entries() ~ part, err := sh.Spec.Sandboxes, error(nil)
join drops every entry of a changed shard ~ part, err := sh.Spec.Entries() ~ part, err := sh.Spec.Sandboxes[:0], error(nil)
join reuses a changed shard's entries ~ prev.rvs[k] == rvs[k]: ~ prev.rvs[k] != "":
changes never applied ~ if changes != "" {\n\t\t\tj.applyChanges( ~ if false {\n\t\t\tj.applyChanges(
changes applied to a shard a later fold wrote ~ return shards[k] == nil || shards[k].Spec.Fold <= changes.Fold ~ return true
changes memo kept for a new inventory version ~ || j.changes != changes: ~ :
join takes shards older than the inventory names ~ case wait == waitOn: ~ case false:
join waits for a shard write forever ~ if now.Sub(j.waitSince) < s.grace { ~ if true {
join waits again for a shard write it gave up on ~ if newest >= want || want <= j.gaveUp { ~ if newest >= want {
changes' removed IDs ignored ~ removed[id], touched[k] = struct{}{}, true ~ touched[k] = true
changed entry joins beside the one it replaces ~ if len(cs) > 0 && entries[cs[0]].ID == id { ~ if len(cs) > 0 && entries[cs[0]].ID == id && false {
new entries after the shard's, not merged by ID ~ (i == len(part) || entries[cs[0]].ID < part[i].ID) ~ (i == len(part))
unsorted shard merged as it is ~ if !j.sorted[k] { ~ if false {
changes merged in the inventory's order, not by ID ~ slices.SortFunc(cs, byID) ~ _ = byID
tracked join reads every shard ~ clean = s.tracked && j.stamp == stamp && len(j.rvs) == n ~ clean = false
tracked join never reads the shards again ~ clean = s.tracked && j.stamp == stamp && len(j.rvs) == n ~ clean = s.tracked
shard events not recorded ~ s.events++\n\tsh, ok := ~ s.events++\n\treturn\n\tsh, ok :=
an event of no known node marks none ~ s.epoch = s.events\n ~ _ = s.events\n
joined inventory keeps its changes ~ inv.Spec.SandboxChanges = nil ~ _ = inv.Spec.SandboxChanges
MUTANTS
)

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Built once: a go run per mutant linked it fifty times.
go build -o "$tmp/apply" "$root/hack/mutate/apply.go"

# try runs mutant n: its verdict (killed, lived, or why it could not run) in
# $tmp/n/verdict. A mutant is mostly the link of a test binary, which is one
# core's work: MUTATE_JOBS (2) run at once.
try() {
	local n=$1 name=$2 orig=$3 mut=$4 dir="$tmp/$1"
	mkdir "$dir"
	if ! MUT_FILE="$file" MUT_ORIG="$orig" MUT_NEW="$mut" MUT_OUT="$dir/source.go" "$tmp/apply"; then
		echo "its original text is not in source.go exactly once; update hack/mutate.sh" > "$dir/verdict"
		return
	fi
	printf '{"Replace":{"%s":"%s"}}' "$file" "$dir/source.go" > "$dir/overlay.json"
	if go test -count=1 -vet=off -overlay "$dir/overlay.json" ./inventory/kubeinventory > "$dir/out" 2>&1; then
		echo lived > "$dir/verdict"
	elif grep -q -e '\[build failed\]' -e '\[setup failed\]' "$dir/out"; then
		{ echo "it does not compile:"; cat "$dir/out"; } > "$dir/verdict"
	else
		echo killed > "$dir/verdict"
	fi
}

names=()
while IFS= read -r line; do
	[[ -z "$line" ]] && continue
	name="${line%% ~ *}" rest="${line#* ~ }"
	orig="${rest%% ~ *}" mut="${rest#* ~ }"
	while (($(jobs -rp | wc -l) >= ${MUTATE_JOBS:-2})); do wait -n; done
	try "${#names[@]}" "$name" "$orig" "$mut" &
	names+=("$name")
done <<< "$mutants"
wait

killed=0 lived=0 broken=0
for n in "${!names[@]}"; do
	verdict=$(cat "$tmp/$n/verdict" 2>/dev/null || echo "it did not run")
	case $verdict in
	killed) echo "KILLED  ${names[$n]}"; killed=$((killed + 1)) ;;
	lived) echo "LIVED   ${names[$n]}"; lived=$((lived + 1)) ;;
	*) echo "mutant \"${names[$n]}\": $verdict" >&2; broken=$((broken + 1)) ;;
	esac
done
echo "named mutants: $killed killed, $lived lived"
[[ $lived -eq 0 && $broken -eq 0 ]]
