#!/bin/bash
# Copy the decisive designs' finished runs from the run worktree (one fixed commit) into this checkout's
# lab/attendout/results/decisive/<design>/ and write each design's verdict (in progress: counts only).
#   lab/attendout/collect_decisive.sh /work/wt-attendout52-run
# A design's runs may come from several processes (--only), each with its own --out (e.g. A and A-p2): their
# runs.jsonl are concatenated; meta.json is the first process's.
set -euo pipefail
run_tree=${1:?the run worktree}
for design in kappa A B; do
  parts=("$run_tree"/lab/attendout/results/decisive/"$design" "$run_tree"/lab/attendout/results/decisive/"$design"-p*)
  dest=lab/attendout/results/decisive/$design
  found=0
  for part in "${parts[@]}"; do [ -f "$part/runs.jsonl" ] && found=1; done
  [ "$found" = 1 ] || continue
  mkdir -p "$dest"
  cp "$run_tree/lab/attendout/results/decisive/$design/meta.json" "$dest/meta.json" 2>/dev/null \
    || cp "$(ls "$run_tree"/lab/attendout/results/decisive/"$design"-p*/meta.json | head -1)" "$dest/meta.json"
  cat "${parts[@]/%//runs.jsonl}" 2>/dev/null > "$dest/runs.jsonl" || true
  python -m lab.attendout decisive-report "$dest" > /dev/null
done
python -m lab.attendout decisive-power lab/attendout/results/decisive > /dev/null
