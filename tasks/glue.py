"""The nine GLUE tasks as data: text fields, hub label order, official metrics, the classic TSV layout, the test sets
a GLUE server submission needs, and the `quick` preset's training budget per task.

Local TSVs are normalised to the hub (`nyu-mll/glue`) label ids; note the orders differ per task
(RTE/QNLI: entailment=0; WNLI: not_entailment=0, entailment=1; MNLI: entailment, neutral, contradiction).
"""
import dataclasses

from suite.api.tasks import LocalSplit, TaskSpec, TestSet, register_task

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
             local_dir="SST-2", phrase_rows=True,
             local={s: LocalSplit(f, {"sentence": "sentence", "label": "label"})
                    for s, f in {"train": "train.tsv", "validation": "dev.tsv"}.items()}),
    TaskSpec("mrpc", "MRPC", PAIR, ("not_equivalent", "equivalent"), ("f1", "accuracy"), (HUB, "mrpc"),
             local_dir="MRPC",
             local={s: LocalSplit(f, {"sentence1": "#1 String", "sentence2": "#2 String", "label": "Quality"})
                    for s, f in {"train": "train.tsv", "validation": "dev.tsv"}.items()}),
    TaskSpec("stsb", "STS-B", PAIR, None, ("pearson", "spearman"), (HUB, "stsb"),
             local_dir="STS-B",
             local={s: _pair_split(f, label="score")
                    for s, f in {"train": "train.tsv", "validation": "dev.tsv"}.items()}),
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
             local={s: _pair_split(f, labels=ENTAIL)
                    for s, f in {"train": "train.tsv", "validation": "dev.tsv"}.items()}),
    TaskSpec("wnli", "WNLI", PAIR, ("not_entailment", "entailment"), ("accuracy",), (HUB, "wnli"),
             local_dir="WNLI",
             # the TSV's 0/1 already follow the hub order (1 = entailment)
             local={s: _pair_split(f) for s, f in {"train": "train.tsv", "validation": "dev.tsv"}.items()}),
]

# Conventions of the GLUE benchmark: tasks are averaged under "GLUE"; WNLI is left out of the average (its dev set is
# adversarial to train-set memorisation: fine-tuned models score below the majority class, as BERT's paper notes).
WNLI_NOTE = "left out of the GLUE average by convention (adversarial dev set; BERT and later papers omit it)"

# Test sets, in the GLUE server's submission format (file stem, columns, what is written).
_PAIR_COLUMNS = {"sentence1": "sentence1", "sentence2": "sentence2"}
_NLI_COLUMNS = {"premise": "sentence1", "hypothesis": "sentence2"}
TEST_SETS = {
    "cola": [TestSet("CoLA", "CoLA/test.tsv", {"sentence": "sentence"}, "ids", hub=(HUB, "cola", "test"))],
    "sst2": [TestSet("SST-2", "SST-2/test.tsv", {"sentence": "sentence"}, "ids", hub=(HUB, "sst2", "test"))],
    "mrpc": [TestSet("MRPC", "MRPC/test.tsv", {"sentence1": "#1 String", "sentence2": "#2 String"}, "ids",
                     hub=(HUB, "mrpc", "test"))],
    "stsb": [TestSet("STS-B", "STS-B/test.tsv", _PAIR_COLUMNS, "score", hub=(HUB, "stsb", "test"))],
    "qnli": [TestSet("QNLI", "QNLI/test.tsv", {"question": "question", "sentence": "sentence"}, "names",
                     hub=(HUB, "qnli", "test"))],
    "rte": [TestSet("RTE", "RTE/test.tsv", _PAIR_COLUMNS, "names", hub=(HUB, "rte", "test"))],
    "wnli": [TestSet("WNLI", "WNLI/test.tsv", _PAIR_COLUMNS, "ids", hub=(HUB, "wnli", "test"))],
    "qqp": [TestSet("QQP", "QQP/test.tsv", {"question1": "question1", "question2": "question2"}, "ids", index="id",
                    hub=(HUB, "qqp", "test"))],
    # the diagnostic set AX is predicted by the MNLI model
    "mnli": [TestSet("MNLI-m", "MNLI/test_matched.tsv", _NLI_COLUMNS, "names", hub=(HUB, "mnli", "test_matched")),
             TestSet("MNLI-mm", "MNLI/test_mismatched.tsv", _NLI_COLUMNS, "names",
                     hub=(HUB, "mnli", "test_mismatched")),
             TestSet("AX", "diagnostic/diagnostic.tsv", _NLI_COLUMNS, "names", hub=(HUB, "ax", "test"))],
}

# The `quick` preset's per-task budgets (over the preset's own settings): a measured vanilla MiniLM sweep on a 2-core
# CPU (docs/results.md, "Calibrating the quick preset"). Batch 16 doubles the optimizer steps where 32 learned too
# slowly (STS-B, CoLA, MRPC); STS-B at lr 2e-4 swung between seeds (29-64 correlation), at 1e-4 it does not (71-76).
QUICK = {
    "sst2": {"max_train_samples": 1000, "epochs": 2, "lr": 1e-4, "train_eval_samples": 128},
    "stsb": {"max_train_samples": 1000, "epochs": 2, "lr": 1e-4, "batch_size": 16, "train_eval_samples": 128},
    "cola": {"max_train_samples": 2000, "epochs": 3, "lr": 1e-4, "batch_size": 16, "train_eval_samples": 128},
    "mrpc": {"max_train_samples": 1000, "epochs": 3, "lr": 1e-4, "batch_size": 16},
}

for _spec in GLUE:
    register_task(dataclasses.replace(
        _spec, benchmark="GLUE", in_average=_spec.name != "wnli",
        average_note=WNLI_NOTE if _spec.name == "wnli" else "",
        score_range=(0.0, 5.0) if _spec.name == "stsb" else None,
        groups=("glue",), test_sets=tuple(TEST_SETS[_spec.name]),
        budgets={"quick": QUICK[_spec.name]} if _spec.name in QUICK else {}))
