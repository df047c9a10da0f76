"""Checks made once, after the grid is built and before anything trains, so that impossible input exits 2 with a
message instead of giving one failed record per job (or, worse, an `ok` record of garbage).

- every package the suite requires is installed and imports, and so does what a run and a report import;
- every distinct model loads: its config, a tokenizer with a real vocabulary (a local folder must hold the tokenizer
  files), weights that are complete and match the architecture, and a type whose tiny copy sends every self-attention
  call to an attached method (the only way a method can apply), to which every method of the grid attaches;
- `--max-length` fits the model's position embeddings;
- every method's hyper-parameters fit its model (`AttentionMethod.check_model_config`, e.g. layers beyond the depth);
- the device exists; every split of every task reads (`check_data`), the tuning and dev subsets can be drawn, and
  test sets exist when predictions are asked for;
- the output folder is writable;
- `--set` / `--sweep` of a method that is not in the grid is pointed out (a warning: it changes nothing).
"""
from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from suite.api.errors import BadInput, DataError, import_checked, import_name
from suite.api.tasks import get_task
from suite.grid.plan import parse_assignment, target_method
from suite.run.data import load_splits, task_data_dir
from suite.run.device import cpu_bf16_native, device_type, pick_device
from suite.run.layout import COMMANDS, OutputFolder, check_folder_name, own_folder
from suite.run.settings import DEFAULT_MODEL, RunConfig, resolve_model

__all__ = ["VERIFIED_MODEL_TYPES", "check_checkpoint_fits", "check_data", "check_dependencies", "check_device",
           "check_file_names",
           "check_grid", "check_methods_fit_models", "check_model", "check_out", "machine_memory", "warn_emulated_bf16",
           "warn_grid", "warn_unused_settings"]  # what the rest of the suite uses; other names are this module's own

# Model types the tests train with every built-in method (tests/test_encoder_types.py); whether a type works with
# the installed transformers is asked of a tiny copy of it (suite.run.models.attention_support)
VERIFIED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "electra", "ernie", "data2vec-text",
                        "roberta-prelayernorm", "modernbert", "distilbert", "albert")

# Weights that may be absent from a checkpoint: the new classification head and the pooler (sentence-embedding
# checkpoints such as MiniLM ship without it); both are initialised fresh, as for any fine-tuning.
FRESH_WEIGHT_PARTS = ("pooler.",)

# Files of the output folder that a grid appends to (records, sidecars and test predictions are written through a
# temporary file and renamed, which replaces a link instead of following it).
APPENDED_FILES = (COMMANDS,)


DISTRIBUTION = "attention-suite"  # pyproject.toml's project name: its requirements are what a run imports


def check_dependencies() -> None:
    """Every package the suite requires is installed and imports, and so do the suite's modules a run, its workers
    and a report import first, checked once in the driver (`suite.api.errors.import_checked`): a missing package
    killed every worker at its start (a GPU machine without `datasets`); one calling sys.exit() ended `run`, exit 0."""
    import re
    from importlib import metadata

    try:
        required = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed: imports decide
        required = []
    missing, installed = [], []
    for requirement in required:
        if "extra ==" in requirement:  # an optional part (test, ray, tracking)
            continue
        name = re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0]
        try:
            metadata.version(name)
            installed.append(name)
        except metadata.PackageNotFoundError:
            missing.append(requirement.split(";")[0].strip())
    if missing:
        raise BadInput(f"the suite needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
                       f"installed: pip install {' '.join(repr(m) if ' ' in m else m for m in missing)} (or "
                       "reinstall the suite: pip install -e .)")
    for name in installed:
        if (module := import_name(name)) is not None:
            import_checked(module, package=name)
    for module in ("suite.run.runner", "suite.methods", "suite.report"):
        import_checked(module)


def check_grid(jobs: Sequence[RunConfig], device: str, sets: Iterable[str] = (), sweeps: Iterable[str] = (),
               executor: str = "local") -> None:
    """Everything that can be checked once for the whole grid: device, models, unused hyper-parameter settings."""
    if not jobs:  # e.g. --model ',' : a comma list of nothing
        raise BadInput("the grid has no runs: --model, --tasks, --methods or --seeds (or the study file) named "
                       "nothing to run; give at least one of each, e.g. --model minilm")
    check_file_names(jobs)
    check_device(device, executor)
    # from the configs alone, before any weights load: a config that claims thousands of layers would otherwise be
    # loaded (and killed for memory) before it could be refused; the cluster's machines are not this one: Ray runs
    # are checked against their own limits
    check_methods_fit_models(jobs, machine_memory(str(pick_device(device))) if executor != "ray" else
                             (2**62, "a Ray cluster"))
    for model in dict.fromkeys(job.model for job in jobs):
        mine = [job for job in jobs if job.model == model]
        check_model(model, max(job.train.max_length for job in mine), mine)
        check_lengths(model, mine)
    warn_grid(jobs, device, sets, sweeps)


NAME_MAX = 255  # bytes in a file name (ext4, XFS, btrfs, APFS; NTFS holds 255 characters)


def check_file_names(jobs: Sequence[RunConfig]) -> None:
    """Every file a run writes beside its record (the longest: its `.predictions.npz` sidecar) has a name that a
    file system holds: a model folder with a long name would otherwise train and then fail to write its record."""
    from suite.run.record import predictions_filename

    for job in jobs:
        name = predictions_filename(job.filename)
        size = len(name.encode("utf-8", "surrogatepass"))
        if size > NAME_MAX:
            raise BadInput(f"{job.label}: its record's files would be named {name[:48]}... ({size} bytes), longer "
                           f"than the {NAME_MAX} bytes a file name holds (TASK__METHOD__seedN__MODEL__HASH, MODEL "
                           "the last part of --model): give the model's folder a shorter name")


def warn_grid(jobs: Sequence[RunConfig], device: str, sets: Iterable[str] = (), sweeps: Iterable[str] = ()) -> None:
    """The grid's warnings that need no model loaded: a real run and `run --dry-run` print the same."""
    warn_unused_settings(sets, sweeps, {job.method for job in jobs})
    warn_emulated_bf16(jobs, device)


def check_methods_fit_models(jobs: Sequence[RunConfig], memory: tuple[int, str] | None = None) -> None:
    """Every method's hyper-parameters against its model's config (e.g. layers to change beyond the depth), and the
    parameters a run will train against the memory of the device (`memory`: bytes and what they are; None: this
    machine's RAM)."""
    from suite.run.models import build_method

    configs, own = {}, {}
    for job in jobs:
        if job.model not in configs:
            configs[job.model] = _load_config(job.model, resolve_model(job.model))
            check_fits_memory(job, claimed_parameters(configs[job.model]), 0, memory)  # before building a skeleton
            own[job.model] = sum(p.numel() for p in _skeleton(job.model, configs[job.model]).parameters())
        method = build_method(job)
        method.check_model_config(configs[job.model])
        check_fits_memory(job, own[job.model], method.extra_parameters(configs[job.model]), memory)


def claimed_parameters(config) -> int:
    """A lower bound on the parameters of an encoder with this config (its layers' attention and feed-forward
    weights), read without building anything: a config claiming 10**9 layers is refused by it before a skeleton
    of them is built (0 for a config without the usual fields)."""
    layers, hidden = getattr(config, "num_hidden_layers", 0), getattr(config, "hidden_size", 0)
    inner = getattr(config, "intermediate_size", 0)
    numbers = (layers, hidden, inner)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in numbers):
        return 0
    return layers * (4 * hidden * hidden + 2 * hidden * inner)


# fp32 weights, as `from_pretrained` loads a checkpoint to predict with it
INFERENCE_BYTES_PER_PARAMETER = 4


def check_checkpoint_fits(folder: Path, device: str) -> None:
    """`predict`'s memory preflight, as `run`'s: a saved model whose config.json claims more parameters (the model's
    and what its method adds) than the device's memory holds as fp32 weights is refused before they are loaded."""
    from suite.run.models import build_method
    from suite.run.test_predictions import checkpoint_job

    job = checkpoint_job(folder)
    config = _load_config(str(folder), str(folder))
    total, where = machine_memory(device)

    def refuse_beyond(count: int) -> None:
        need = count * INFERENCE_BYTES_PER_PARAMETER
        if need > total:
            raise DataError(f"{folder}: its config.json claims {_count(count)} parameters, whose weights need at "
                           f"least {need / 2**30:.1f} GiB, more than the {total / 2**30:.1f} GiB of {where}; predict "
                           "with it on a machine with more memory, or check that config.json is the model's own")

    refuse_beyond(claimed_parameters(config))
    own = sum(p.numel() for p in _skeleton(str(folder), config).parameters())
    refuse_beyond(own + build_method(job).extra_parameters(config))


# fp32 weights, their gradients and AdamW's two moments: the least a training step holds per parameter (mixed
# precision keeps fp32 master weights); activations come on top, so a run refused here could never have fit
TRAINING_BYTES_PER_PARAMETER = 16


def check_fits_memory(job: RunConfig, own: int, extra: int, memory: tuple[int, str] | None = None) -> None:
    """Refuse a run whose parameters alone (the model's plus what its method adds) cannot be trained in the
    device's memory: it would be killed for memory (and put the machine's other work at risk) instead of failing
    with a message. Says how many parameters and bytes, and how much memory there is."""
    total, where = memory or machine_memory()
    need = (own + extra) * TRAINING_BYTES_PER_PARAMETER
    if need <= total:
        return
    added = f"; {job.method} adds {_count(extra)} parameters to the model's {_count(own)}" if extra else ""
    raise BadInput(f"{job.label}: training {_count(own + extra)} parameters needs at least {need / 2**30:.1f} GiB "
                   f"(weights, gradients and AdamW's state, before activations), more than the {total / 2**30:.1f} "
                   f"GiB of {where}{added}. Give smaller hyper-parameters (e.g. a smaller kernel_size) or a smaller "
                   "model.")


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} billion" if n >= 1e9 else f"{n / 1e6:.1f} million" if n >= 1e6 else f"{n:,}"


def machine_memory(device: str = "cpu") -> tuple[int, str]:
    """(bytes, what they are): the GPU's memory for a CUDA device, else this machine's RAM (or the container's
    memory limit when it is lower)."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
        return torch.cuda.get_device_properties(index).total_memory, f"GPU memory on {device}"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 2**62
    try:  # cgroup v2 limit of this container (the file says 'max' when there is none)
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit() and int(limit) < total:
            return int(limit), "memory this container may use"
    except OSError:
        pass
    return total, "memory (RAM) on this machine"


def warn_emulated_bf16(jobs: Sequence[RunConfig], device: str) -> None:
    """bf16 autocast on a CPU without bf16 instructions is emulated: correct, but slower than fp32."""
    if any(job.train.precision == "bf16" for job in jobs) and not device.startswith("cuda") \
            and device_type(device) == "cpu" and not cpu_bf16_native():
        print("warning: train.precision=bf16 on a CPU without bf16 instructions (AVX512-BF16 or AMX) is emulated "
              "and many times slower than fp32: add --precision fp32 (or auto, which picks bf16 only where it is "
              "native)", file=sys.stderr)


def check_device(device: str, executor: str = "local") -> None:
    """The device must exist here; under Ray, CUDA is the cluster's business (the driver may have no GPU)."""
    if executor == "ray" and device.split(":")[0] == "cuda":
        return
    pick_device(device)


def check_model(model: str, max_length: int, jobs: Sequence[RunConfig] = ()) -> None:
    """Load `model` once as the runner will and refuse it (BadInput) when a run or a method of `jobs` cannot use it."""
    from suite.run.models import attention_support, refuse_unfit_methods

    path = resolve_model(model)
    config = _load_config(model, path)
    skeleton = _skeleton(model, config)
    reason = attention_support(config.model_type)  # asked of a tiny copy of the type
    if reason:
        raise BadInput(f"model {model!r} is of type {config.model_type!r}: {reason}, so no attention method can be "
                       f"attached to it. {_supported()}")
    refuse_unfit_methods(model, jobs)
    _check_positions(model, skeleton, max_length)
    _check_tokenizer(model, path)
    _check_weights(model, path, config)


def _load_config(model: str, path: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001  any failure here means the model cannot be used
        raise BadInput(f"cannot load model {model!r}: {type(exc).__name__}: {str(exc)[:300]}\n"
                       f"Give a local folder with config.json, weights and tokenizer files, a hub id (needs "
                       f"internet or the hub cache), or '{DEFAULT_MODEL}' for the offline default.") from None


def _classifier(path_or_config, **kwargs):
    from transformers import AutoModelForSequenceClassification

    from suite.run.models import quiet_transformers

    with quiet_transformers():
        if isinstance(path_or_config, str):
            return AutoModelForSequenceClassification.from_pretrained(path_or_config, **kwargs)
        return AutoModelForSequenceClassification.from_config(path_or_config)


def _skeleton(model: str, config):
    """The classifier built from the config on the meta device: its structure without memory or weights."""
    import torch

    try:
        with torch.device("meta"):
            return _classifier(config)
    except Exception as exc:  # noqa: BLE001
        raise BadInput(f"model {model!r} (type {config.model_type!r}) has no sequence-classification class in "
                       f"transformers: {type(exc).__name__}: {str(exc)[:200]}. {_supported()}") from None


def _supported() -> str:
    from suite.run.models import attention_support

    works = [t for t in VERIFIED_MODEL_TYPES if attention_support(t) is None]
    return f"Model types that work with this transformers: {', '.join(works)} (MiniLM is a BERT)."


def position_limit(skeleton) -> int | None:
    """The longest input the model's position embeddings hold (None: no absolute positions). RoBERTa-style models
    number positions from pad_token_id + 1 (their embeddings have a `padding_idx`), which takes that many entries
    off the table."""
    positions = getattr(skeleton.config, "max_position_embeddings", None)
    if not positions:
        return None
    padding_idx = getattr(getattr(skeleton.base_model, "embeddings", None), "padding_idx", None)
    return positions - (padding_idx + 1 if padding_idx is not None else 0)


def _check_positions(model: str, skeleton, max_length: int) -> None:
    limit = position_limit(skeleton)
    if limit is not None and max_length > limit:
        raise BadInput(f"--max-length {max_length} (train.max_length) is longer than model {model!r} can take: its "
                       f"position embeddings hold {limit} tokens. Give --max-length {limit} or less.")


def check_lengths(model: str, jobs: Sequence[RunConfig]) -> None:
    """train.max_length must leave room for text: the tokenizer's special tokens ([CLS] a [SEP] b [SEP]) plus at
    least one token of each text field. Below that a tokenizer either cannot truncate (it then silently keeps the
    whole input) or the model sees only special tokens: a run that records `ok` and means nothing."""
    from transformers import AutoTokenizer

    from suite.api.tasks import get_task

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
    for job in jobs:
        fields = len(get_task(job.task).text_fields)
        least = tokenizer.num_special_tokens_to_add(pair=fields == 2) + fields
        if job.train.max_length < least:
            raise BadInput(f"--max-length {job.train.max_length} (train.max_length) leaves no room for text on "
                           f"{get_task(job.task).display} with model {model!r}: its tokenizer adds "
                           f"{least - fields} special tokens, so the least useful length is {least}; use a larger "
                           "value (128 is usual for GLUE)")


def _check_tokenizer(model: str, path: str) -> None:
    from suite.run.models import checked_tokenizer

    checked_tokenizer(model, path)


def _check_weights(model: str, path: str, config) -> None:
    """Load the weights as the runner does: missing or truncated files fail here, and weights that leave the model
    body partly uninitialised (another architecture's checkpoint) are refused."""
    try:
        loaded, info = _classifier(path, output_loading_info=True, ignore_mismatched_sizes=True)
    except Exception as exc:  # noqa: BLE001
        raise BadInput(f"cannot load the weights of model {model!r}: {type(exc).__name__}: {str(exc)[:300]}. "
                       "A folder needs config.json with complete weights (model.safetensors or "
                       "pytorch_model.bin); re-download or re-save the model.") from None
    prefix = loaded.base_model_prefix + "."
    mismatched = [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys", ())]
    body = sorted(k for k in [*info.get("missing_keys", ()), *mismatched]
                  if k.startswith(prefix) and not any(part in k for part in FRESH_WEIGHT_PARTS))
    if body:
        raise BadInput(f"the weights of model {model!r} do not fit its config ({config.model_type}): {len(body)} "
                       f"weights of the model body are missing or of another shape, e.g. {', '.join(body[:3])}. "
                       "Are config.json and the weights from the same model?")


def check_out(store, tuning: bool = False, until_decided: bool = False) -> None:
    """Create the output folder and write (and remove) a file in it and in its runs folder (and the tuning stage's,
    with `tuning`), so that an unwritable or full disk is found before training rather than when the first record
    is written. The files the grid appends to must not be symbolic links: writing through one could change a file
    outside --out; the state files it rewrites (the selection with `tuning`, the looks with `until_decided`) must
    be files where they exist."""
    check_folder_name("--out", store.root)
    out = OutputFolder(store.root)
    states = [path for path, used in ((out.selection, tuning), (out.until_decided, until_decided)) if used]
    for path in states:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise BadInput(f"--out {store.root}: {path} is {'a link' if path.is_symlink() else 'not a file'}; the "
                           "grid rewrites this file after each stage: remove it, or choose another --out")
    folders = [store.root, store.runs]
    if tuning:
        if out.tuning.root.is_symlink():
            own_folder(out.tuning.root)  # a link planted there is replaced, never written through
        folders += [out.tuning.root, out.tuning.runs]
    for name in APPENDED_FILES:
        if (store.root / name).is_symlink():
            raise BadInput(f"--out {store.root}: {store.root / name} is a symbolic link (to "
                           f"{os.readlink(store.root / name)}); the suite appends to this file and never writes "
                           "through links: remove the link, or choose another --out")
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".tmp-probe-", suffix=".json") as fh:
                fh.write(b"{}")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise BadInput(f"--out {store.root}: cannot write to {folder} ({type(exc).__name__}: "
                           f"{exc.strerror or exc}). Choose another --out, or free space / fix the permissions "
                           "there.") from None


def warn_unused_settings(sets: Iterable[str], sweeps: Iterable[str], methods: set[str]) -> None:
    """`--set`/`--sweep` of `M.KEY` or `M:train.KEY` for a method that is not run changes nothing: say so (a typo
    is likely)."""
    for flag, texts in (("--set", sets), ("--sweep", sweeps)):
        for text in texts:
            method = target_method(parse_assignment(text, sweep=flag == "--sweep")[0])
            if method is not None and method not in methods:
                print(f"warning: {flag} {text} has no effect: method {method!r} is not in --methods "
                      f"({', '.join(sorted(methods))})", file=sys.stderr)


def check_data(plan, local_only: bool = False) -> None:
    """Read every split of the grid's tasks now (a missing file or a malformed line stops the grid before training)
    and find the test sets when predictions are asked for; `local_only` (a dry run): only the data found here."""
    from suite.run.draws import check_heldout_task, check_holdouts, train_groups

    for task in plan.tasks:
        spec = get_task(task)
        where = task_data_dir(spec, plan.data_dir)
        if local_only and (where is None or not where.is_dir()):
            print(f"note: {spec.display}'s data is {'on the hub' if where is None else f'not in {where}'}: the real "
                  "run reads and checks it (a dry run checks the data it finds)", file=sys.stderr)
            continue
        splits = load_splits(spec, plan.data_dir)
        train = splits[spec.train_split]
        trains = [j.train for j in plan.jobs if j.task == task]
        check_heldout_task(spec, trains)
        check_holdouts(train["label"], trains, not spec.is_regression, spec.display, train_groups(spec, train, trains))
        if spec.is_regression:
            _check_scores_vary(spec, splits, trains, plan.data_dir)
        if plan.outputs.predict_test:
            from suite.run.test_predictions import available_test_sets

            found, absent = available_test_sets(spec, task_data_dir(spec, plan.data_dir))
            if not found:
                raise BadInput(f"--predict-test: {spec.display} has no test set here "
                               f"({', '.join(absent) or 'none declared'}); drop the task or the option")


def _check_scores_vary(spec, splits: dict, trains, data_dir) -> None:
    """A regression task is scored by correlation, which gold scores that are all equal leave undefined: such a dev
    subset would train every run and then fail (or score nothing); stop before training and name the file."""
    from suite.run.draws import dev_rows

    for suffix, split in spec.eval_splits.items():
        labels = splits[split]["label"]
        for t in {(t.max_eval_samples, t.data_seed): t for t in trains}.values():
            used = {labels[i] for i in dev_rows(len(labels), t)}
            if len(used) < 2:
                where, layout = task_data_dir(spec, data_dir), spec.local.get(split)
                source = where / spec.local_dir / layout.file if where is not None and layout else f"hub split {split}"
                raise BadInput(f"{spec.display}: every gold score of the dev examples used from {source} is "
                               f"{next(iter(used), 'absent')!r}, so the correlation that scores the task is undefined; "
                               "repair the file, or use more dev examples (--max-eval-samples)")
