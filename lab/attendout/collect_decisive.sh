#!/bin/bash
# Copy the decisive designs' finished runs from the run worktree (one fixed commit) into this checkout's
# lab/attendout/results/decisive/<design>/ and write each design's verdict (in progress: counts only).
#   lab/attendout/collect_decisive.sh /work/wt-ao66
# A run worktree of a commit before the lab (issue 69) keeps them in results/attendout_decisive/, a later one in
# lab/attendout/results/decisive/. A design's runs may come from several processes (--only), each with its own --out
# (e.g. A and A-p2): their runs.jsonl are concatenated; meta.json is the first process's.
set -euo pipefail
run_tree=${1:?the run worktree}
src=$run_tree/lab/attendout/results/decisive
[ -d "$src" ] || src=$run_tree/results/attendout_decisive
for design in kappa A B A_real rloo2; do
  parts=("$src/$design" "$src/$design"-p*)
  dest=lab/attendout/results/decisive/$design
  found=0
  for part in "${parts[@]}"; do [ -f "$part/runs.jsonl" ] && found=1; done
  [ "$found" = 1 ] || continue
  mkdir -p "$dest"
  cp "$src/$design/meta.json" "$dest/meta.json" 2>/dev/null \
    || cp "$(ls "$src/$design"-p*/meta.json | head -1)" "$dest/meta.json"
  cat "${parts[@]/%//runs.jsonl}" 2>/dev/null > "$dest/runs.jsonl" || true
done
# verdicts after every copy: A_real's test runs Holm over both real-reward forms, so it reads rloo2's runs too
for design in kappa A B A_real rloo2; do
  dest=lab/attendout/results/decisive/$design
  [ -f "$dest/runs.jsonl" ] && python -m lab.attendout decisive-report "$dest" > /dev/null
done
python -m lab.attendout decisive-power lab/attendout/results/decisive > /dev/null
