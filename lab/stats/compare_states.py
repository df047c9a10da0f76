"""Two `run --until-decided` state files side by side: each primary comparison's stopping reason, verdict, paired
seeds and deciding p-value in the first and in the second, marking the comparisons whose outcome moved.

    git show c5f1af5:results/until_decided.json > /tmp/before.json
    python -m lab.stats.compare_states /tmp/before.json results/until_decided.json
"""
from __future__ import annotations

import json
import sys


def _last(c: dict) -> str:
    look = c["looks"][-1]
    p = look.get("p_equiv") if c["reason"] == "equivalence" else look.get("p")
    text = f"{c['reason']}, {c['verdict']}, {look['n']} seeds"
    if p is not None:
        text += f", {'TOST ' if c['reason'] == 'equivalence' else ''}p {p:.2g}"
    if look.get("degenerate"):
        text += f", degenerate {look['degenerate']} vs {look.get('degenerate_reference', 0)}"
    return text


def table(before: dict, after: dict) -> str:
    old = {(c["task"], c["method"]): c for c in before["comparisons"]}
    rows = ["| task | method | before | after | moved |", "|---|---|---|---|---|"]
    for c in after["comparisons"]:
        o = old.get((c["task"], c["method"]))
        moved = o is None or (o["reason"], o["verdict"]) != (c["reason"], c["verdict"])
        rows.append(f"| {c['task']} | {c['method']} | {_last(o) if o else '–'} | {_last(c)} | "
                    f"{'**yes**' if moved else ''} |")
    return "\n".join(rows)


if __name__ == "__main__":
    first, second = (json.load(open(path)) for path in sys.argv[1:3])
    print(table(first, second))
