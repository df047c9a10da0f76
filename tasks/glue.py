"""The nine GLUE tasks as data, one `TaskSpec` each: text fields, hub label order, official metrics, the classic TSV
layout, the test sets a GLUE server submission needs, and the `quick` preset's training budget.

Local TSVs are normalised to the hub (`nyu-mll/glue`) label ids; note the orders differ per task
(RTE/QNLI: entailment=0; WNLI: not_entailment=0, entailment=1; MNLI: entailment, neutral, contradiction).
"""
from suite.api.tasks import LocalSplit, TaskSpec, TestSet, register_task

HUB = "nyu-mll/glue"
BENCHMARK, GROUPS = "GLUE", ("glue",)  # tasks are averaged under "GLUE" and selected together by `--tasks glue`
PAIR = ("sentence1", "sentence2")
ENTAIL = {"entailment": 0, "not_entailment": 1}
TRAIN_DEV = {"train": "train.tsv", "validation": "dev.tsv"}
PAIR_COLUMNS = {"sentence1": "sentence1", "sentence2": "sentence2"}  # a test file's columns, as the dev file's
NLI_COLUMNS = {"premise": "sentence1", "hypothesis": "sentence2"}


def tsv_splits(columns: dict[str, str | int], *, header: bool = True, labels: dict[str, int] | None = None,
               files: dict[str, str] = TRAIN_DEV) -> dict[str, LocalSplit]:
    """Hub split -> its TSV, every file with the same columns."""
    return {split: LocalSplit(file, columns, header=header, labels=labels) for split, file in files.items()}


# The `quick` preset's budgets (over the preset's own settings) come from a measured vanilla MiniLM sweep on a 2-core
# CPU (docs/results.md, "Calibrating the quick preset"). Batch 16 doubles the optimizer steps where 32 learned too
# slowly (STS-B, CoLA, MRPC); STS-B at lr 2e-4 swung between seeds (29-64 correlation), at 1e-4 it does not (71-76).
GLUE = [
    TaskSpec(name="cola", display="CoLA", text_fields=("sentence",), label_names=("unacceptable", "acceptable"),
             metrics=("mcc",), hub=(HUB, "cola"), local_dir="CoLA",
             # train/dev have no header: source, label, original label, sentence
             local=tsv_splits({"sentence": 3, "label": 1}, header=False),
             benchmark=BENCHMARK, groups=GROUPS,
             test_sets=(TestSet("CoLA", "CoLA/test.tsv", {"sentence": "sentence"}, "ids", hub=(HUB, "cola", "test")),),
             budgets={"quick": {"max_train_samples": 2000, "epochs": 3, "lr": 1e-4, "batch_size": 16,
                                "train_eval_samples": 128}}),
    TaskSpec(name="sst2", display="SST-2", text_fields=("sentence",), label_names=("negative", "positive"),
             metrics=("accuracy",), hub=(HUB, "sst2"), local_dir="SST-2",
             local=tsv_splits({"sentence": "sentence", "label": "label"}),
             benchmark=BENCHMARK, groups=GROUPS,
             test_sets=(TestSet("SST-2", "SST-2/test.tsv", {"sentence": "sentence"}, "ids",
                                hub=(HUB, "sst2", "test")),),
             budgets={"quick": {"max_train_samples": 1000, "epochs": 2, "lr": 1e-4, "train_eval_samples": 128}},
             phrase_rows=True),
    TaskSpec(name="mrpc", display="MRPC", text_fields=PAIR, label_names=("not_equivalent", "equivalent"),
             metrics=("f1", "accuracy"), hub=(HUB, "mrpc"), local_dir="MRPC",
             local=tsv_splits({"sentence1": "#1 String", "sentence2": "#2 String", "label": "Quality"}),
             benchmark=BENCHMARK, groups=GROUPS,
             test_sets=(TestSet("MRPC", "MRPC/test.tsv", {"sentence1": "#1 String", "sentence2": "#2 String"},
                                "ids", hub=(HUB, "mrpc", "test")),),
             budgets={"quick": {"max_train_samples": 1000, "epochs": 3, "lr": 1e-4, "batch_size": 16}}),
    TaskSpec(name="stsb", display="STS-B", text_fields=PAIR, label_names=None, metrics=("pearson", "spearman"),
             hub=(HUB, "stsb"), local_dir="STS-B",
             local=tsv_splits({"sentence1": "sentence1", "sentence2": "sentence2", "label": "score"}),
             benchmark=BENCHMARK, score_range=(0.0, 5.0), groups=GROUPS,
             test_sets=(TestSet("STS-B", "STS-B/test.tsv", PAIR_COLUMNS, "score", hub=(HUB, "stsb", "test")),),
             budgets={"quick": {"max_train_samples": 1000, "epochs": 2, "lr": 1e-4, "batch_size": 16,
                                "train_eval_samples": 128}}),
    TaskSpec(name="qqp", display="QQP", text_fields=("question1", "question2"),
             label_names=("not_duplicate", "duplicate"), metrics=("f1", "accuracy"), hub=(HUB, "qqp"),
             local_dir="QQP",
             local=tsv_splits({"question1": "question1", "question2": "question2", "label": "is_duplicate"}),
             benchmark=BENCHMARK, groups=GROUPS,
             test_sets=(TestSet("QQP", "QQP/test.tsv", {"question1": "question1", "question2": "question2"}, "ids",
                                index="id", hub=(HUB, "qqp", "test")),)),
    TaskSpec(name="mnli", display="MNLI", text_fields=("premise", "hypothesis"),
             label_names=("entailment", "neutral", "contradiction"), metrics=("accuracy",), hub=(HUB, "mnli"),
             eval_splits={"m": "validation_matched", "mm": "validation_mismatched"}, local_dir="MNLI",
             local=tsv_splits({"premise": "sentence1", "hypothesis": "sentence2", "label": "gold_label"},
                              labels={"entailment": 0, "neutral": 1, "contradiction": 2},
                              files={"train": "train.tsv", "validation_matched": "dev_matched.tsv",
                                     "validation_mismatched": "dev_mismatched.tsv"}),
             benchmark=BENCHMARK, groups=GROUPS,
             # the diagnostic set AX is predicted by the MNLI model
             test_sets=(TestSet("MNLI-m", "MNLI/test_matched.tsv", NLI_COLUMNS, "names",
                                hub=(HUB, "mnli", "test_matched")),
                        TestSet("MNLI-mm", "MNLI/test_mismatched.tsv", NLI_COLUMNS, "names",
                                hub=(HUB, "mnli", "test_mismatched")),
                        TestSet("AX", "diagnostic/diagnostic.tsv", NLI_COLUMNS, "names", hub=(HUB, "ax", "test")))),
    TaskSpec(name="qnli", display="QNLI", text_fields=("question", "sentence"),
             label_names=("entailment", "not_entailment"), metrics=("accuracy",), hub=(HUB, "qnli"),
             local_dir="QNLI",
             local=tsv_splits({"question": "question", "sentence": "sentence", "label": "label"}, labels=ENTAIL),
             benchmark=BENCHMARK, groups=GROUPS,
             test_sets=(TestSet("QNLI", "QNLI/test.tsv", {"question": "question", "sentence": "sentence"}, "names",
                                hub=(HUB, "qnli", "test")),)),
    TaskSpec(name="rte", display="RTE", text_fields=PAIR, label_names=("entailment", "not_entailment"),
             metrics=("accuracy",), hub=(HUB, "rte"), local_dir="RTE",
             local=tsv_splits({"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"}, labels=ENTAIL),
             benchmark=BENCHMARK, groups=GROUPS,
             test_sets=(TestSet("RTE", "RTE/test.tsv", PAIR_COLUMNS, "names", hub=(HUB, "rte", "test")),)),
    TaskSpec(name="wnli", display="WNLI", text_fields=PAIR, label_names=("not_entailment", "entailment"),
             metrics=("accuracy",), hub=(HUB, "wnli"), local_dir="WNLI",
             # the TSV's 0/1 already follow the hub order (1 = entailment)
             local=tsv_splits({"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"}),
             benchmark=BENCHMARK, groups=GROUPS,
             # its dev set is adversarial to train-set memorisation: fine-tuned models score below the majority
             # class, as BERT's paper notes
             in_average=False,
             average_note="left out of the GLUE average by convention (adversarial dev set; BERT and later papers "
                          "omit it)",
             test_sets=(TestSet("WNLI", "WNLI/test.tsv", PAIR_COLUMNS, "ids", hub=(HUB, "wnli", "test")),)),
]

for _spec in GLUE:
    register_task(_spec)
