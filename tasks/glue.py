"""The nine GLUE tasks as data: text fields, hub label order, official metrics and the classic TSV layout.

Local TSVs are normalised to the hub (`nyu-mll/glue`) label ids; note the orders differ per task
(RTE/QNLI: entailment=0; WNLI: not_entailment=0, entailment=1; MNLI: entailment, neutral, contradiction).
"""
import dataclasses

from suite.api.tasks import LocalSplit, TaskSpec, register_task

HUB = "nyu-mll/glue"
PAIR = ("sentence1", "sentence2")
ENTAIL = {"entailment": 0, "not_entailment": 1}


def _pair_split(file, text=PAIR, label="label", labels=None):
    return LocalSplit(file, {text[0]: text[0], text[1]: text[1], "label": label}, labels=labels)


GLUE = [
    TaskSpec("cola", "CoLA", ("sentence",), ("unacceptable", "acceptable"), ("mcc",), (HUB, "cola"),
             local_dir="CoLA",
             # train/dev have no header: source, label, original label, sentence
             local={s: LocalSplit(f, {"sentence": 3, "label": 1}, header=False)
                    for s, f in {"train": "train.tsv", "validation": "dev.tsv"}.items()}),
    TaskSpec("sst2", "SST-2", ("sentence",), ("negative", "positive"), ("accuracy",), (HUB, "sst2"),
             local_dir="SST-2",
             local={s: LocalSplit(f, {"sentence": "sentence", "label": "label"})
                    for s, f in {"train": "train.tsv", "validation": "dev.tsv"}.items()}),
    TaskSpec("mrpc", "MRPC", PAIR, ("not_equivalent", "equivalent"), ("f1", "accuracy"), (HUB, "mrpc"),
             local_dir="MRPC",
             local={s: LocalSplit(f, {"sentence1": "#1 String", "sentence2": "#2 String", "label": "Quality"})
                    for s, f in {"train": "train.tsv", "validation": "dev.tsv"}.items()}),
    TaskSpec("stsb", "STS-B", PAIR, None, ("pearson", "spearman"), (HUB, "stsb"),
             local_dir="STS-B",
             local={s: _pair_split(f, label="score") for s, f in {"train": "train.tsv", "validation": "dev.tsv"}.items()}),
    TaskSpec("qqp", "QQP", ("question1", "question2"), ("not_duplicate", "duplicate"), ("f1", "accuracy"),
             (HUB, "qqp"), local_dir="QQP",
             local={s: _pair_split(f, ("question1", "question2"), "is_duplicate")
                    for s, f in {"train": "train.tsv", "validation": "dev.tsv"}.items()}),
    TaskSpec("mnli", "MNLI", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"), ("accuracy",),
             (HUB, "mnli"), eval_splits={"m": "validation_matched", "mm": "validation_mismatched"},
             local_dir="MNLI",
             local={s: LocalSplit(f, {"premise": "sentence1", "hypothesis": "sentence2", "label": "gold_label"},
                                  labels={"entailment": 0, "neutral": 1, "contradiction": 2})
                    for s, f in {"train": "train.tsv", "validation_matched": "dev_matched.tsv",
                                 "validation_mismatched": "dev_mismatched.tsv"}.items()}),
    TaskSpec("qnli", "QNLI", ("question", "sentence"), ("entailment", "not_entailment"), ("accuracy",),
             (HUB, "qnli"), local_dir="QNLI",
             local={s: _pair_split(f, ("question", "sentence"), labels=ENTAIL)
                    for s, f in {"train": "train.tsv", "validation": "dev.tsv"}.items()}),
    TaskSpec("rte", "RTE", PAIR, ("entailment", "not_entailment"), ("accuracy",), (HUB, "rte"),
             local_dir="RTE",
             local={s: _pair_split(f, labels=ENTAIL) for s, f in {"train": "train.tsv", "validation": "dev.tsv"}.items()}),
    TaskSpec("wnli", "WNLI", PAIR, ("not_entailment", "entailment"), ("accuracy",), (HUB, "wnli"),
             local_dir="WNLI",
             # the TSV's 0/1 already follow the hub order (1 = entailment)
             local={s: _pair_split(f) for s, f in {"train": "train.tsv", "validation": "dev.tsv"}.items()}),
]

# Conventions of the GLUE benchmark: tasks are averaged under "GLUE"; WNLI is left out of the average (its dev set is
# adversarial to train-set memorisation: fine-tuned models score below the majority class, as BERT's paper notes).
WNLI_NOTE = "left out of the GLUE average by convention (adversarial dev set; BERT and later papers omit it)"

for _spec in GLUE:
    _spec = dataclasses.replace(
        _spec, benchmark="GLUE", in_average=_spec.name != "wnli",
        average_note=WNLI_NOTE if _spec.name == "wnli" else "",
        score_range=(0.0, 5.0) if _spec.name == "stsb" else None)
    register_task(_spec, groups=["glue"])
