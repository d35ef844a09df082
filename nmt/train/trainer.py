"""The training loop: updates, validation, checkpoints, resume, logging.

``Trainer(config).train()`` runs a whole training from a resolved config (see
``nmt.config.load_config``). When ``save_dir/last.pt`` exists the run resumes from
it (when it is missing or damaged while older checkpoints exist, from the newest of them that
loads, with a warning: :func:`nmt.train.checkpoint.find_resume_checkpoint`): weights,
optimizer, schedule, early-stopping state, RNG states and the position in the data order (epoch and batch index; each epoch's batch order is a function of the seed and
the epoch) are restored, so on CPU an interrupted and resumed run reaches the same
parameters as an uninterrupted one.
"""
from __future__ import annotations

import logging
import math
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from nmt.config import (ConfigError, added_at_default, config_differences, config_value, resume_defaults,
                        save_config, saved_value)
from nmt.config.options import DECODING_METRICS, HIGHER_IS_BETTER, SCHEMA
from nmt.data.batching import collate, make_batch_order
from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.data.pair_filter import describe_skipped
from nmt.data.vocabulary import BOS, EOS, PAD
from nmt.models import ModelConfigError, build_model, describe_attention
from nmt.models.copy_attention import source_to_target
from nmt.models.transformer.checkpointing import set_activation_checkpointing
from nmt.models.protocol import position_limits
from nmt.sparse import get_loss, is_softmax, loss_display_name
from nmt.train.checkpoint import (CheckpointError, best_check, find_resume_checkpoint, load_checkpoint,
                                  remove_stale_temporaries, repair_best, restore_last, save_run_checkpoint,
                                  set_aside_damaged)
from nmt.train.distill import DistillForward, check_distill, load_teacher, teacher_change
from nmt.train.alignment_error import validation_aer
from nmt.train.guided_alignment import GuidedForward, check_guided_alignment, guided_alignment, guided_weight
from nmt.train.data_setup import (DATA_FILE_KEYS, check_valid_positions, data_changes, data_fingerprints,
                                  generate_if_missing, load_extra_validation, load_training_data, source_noise,
                                  write_run_vocabularies)
from nmt.train.distributed import (NullLock, distributed_state, in_rank_order, init_distributed, rank_device,
                                   rank_rng_state, resume_check, several_processes, shard_batch, wrap_model)
from nmt.train.early_stopping import EarlyStopping
from nmt.train.keep_best import KeptBest, restore_kept
from nmt.train.ema import WeightAverage
from nmt.train import freeze, init_from, pretrained_embeddings
from nmt.train.interrupt import GracefulInterrupt
from nmt.train.nonfinite import (MAX_CONSECUTIVE_SKIPS, DroppedUpdates, NonFiniteGuard, NonFiniteLossError,
                                 check_parameters_finite, kept_state)
from nmt.train.optimizers import build_optimizer
from nmt.train.overflow import OverflowSkips, scale_text
from nmt.train.rng import rng_state, seed_everything, set_rng_state
from nmt.train.compile import compile_for_device, compile_loss_forward, compiler_problem, pad_to_multiple
from nmt.train.precision import TrainPrecision
from nmt.train.schedules import build_schedule
from nmt.train.update import loss_forward, update
from nmt.train.validation import (attention_grids, attention_matrices, batch_statistics, search_description,
                                  validate, validation_search)
from nmt.utils.dir_lock import DirectoryLock
from nmt.utils.heatmap import attention_title
from nmt.utils.device import auto_device, device_name_problem, device_problem, indexed, make_current
from nmt.utils.metrics_log import MetricsLog
from nmt.utils.tensorboard import TensorBoardWriter

logger = logging.getLogger(__name__)

RUN_LOCK_WHAT = "nmt-train run"
RESUME_MUST_MATCH = ("model", "data", "training.seed", "training.batch_size", "training.batch_type",
                     "training.bucket_size", "training.pool_sort")  # all that makes the batch order the data position indexes
RESUME_OPTIMIZER_MUST_MATCH = ("training.optimizer.name", "training.optimizer.decay_vectors")
"""What the checkpoint's optimizer state must fit: its kind and its parameter groups."""


@dataclass
class Progress:
    """Where training is: everything besides weights/optimizer/schedule/RNG that resume needs."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    elapsed: float = 0.0  # training seconds over all sessions
    last_validation_step: int = 0
    valid_loss_sum: float = 0.0  # training loss / tokens since the last validation (for metrics.jsonl)
    valid_tokens: int = 0


@dataclass
class TrainSummary:
    """What a run ended with; ``stopped_by`` is max_steps, max_epochs, max_minutes, early_stopping or a signal name."""

    step: int
    epoch: int
    best_step: int
    best_metric: str
    best_value: float
    elapsed: float
    stopped_by: str
    save_dir: str

    def line(self) -> str:
        """One human-readable summary line."""
        best = (f"best valid {self.best_metric} {self.best_value:.4g} at step {self.best_step}"
                if self.best_step >= 0 else "no validation yet")
        return (f"training {'interrupted' if self.stopped_by.startswith('SIG') else 'finished'} "
                f"({self.stopped_by}) at step {self.step} (epoch {self.epoch}): {best}; "
                f"elapsed {_duration(self.elapsed)}; checkpoints in {self.save_dir}")


def resolve_device(name: str) -> torch.device:
    """The training device by an explicit name: ``auto`` -> CUDA when available, else the CPU;
    ``cuda`` -> the current CUDA device by its index. Under torchrun with several processes a
    CUDA run's index is each process's own (:func:`nmt.train.distributed.rank_device`): only
    CUDA itself is checked here, and a configured index is ignored (logged). ValueError (one line)
    for a device this machine cannot allocate on."""
    problem = device_name_problem(name)
    if problem is not None:
        raise ValueError(f"{name!r} is {problem}")
    device = torch.device(auto_device(name))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name!r} requested but CUDA is not available")
    if device.type == "cuda" and several_processes():  # no GPU touched before the rank's own is set
        if device.index is not None:
            logger.warning("training.device %s: under torchrun each process trains on its own GPU", name)
        return torch.device("cuda")
    if name != "auto":
        problem = device_problem(device)
        if problem is not None:
            raise ValueError(f"{name!r} is not usable here ({problem})")
    return indexed(device)


def check_run_config(config: dict, source: str) -> torch.device:
    """The checks of a resolved config that need torch (device, a compiler for ``training.compile``,
    decoding metric, the validation search by ``SearchOptions``' own checks); returns the device.

    Raises ConfigError naming ``source`` and the key; writes nothing (nmt-train calls it
    before it creates the run directory).
    """
    train_cfg, valid_cfg = config["training"], config["validation"]
    try:
        device = resolve_device(train_cfg["device"])
    except ValueError as exc:
        raise ConfigError(source, "training.device", str(exc)) from None
    if train_cfg["compile"]:
        problem = compiler_problem(device)
        if problem is not None:
            raise ConfigError(source, "training.compile", problem)
    if train_cfg["checkpoint_activations"] and config["model"]["type"] != "transformer":
        raise ConfigError(source, "training.checkpoint_activations",
                          f"recomputes Transformer layers; model.type is {config['model']['type']!r} "
                          "(set model.type: transformer or checkpoint_activations: false)")
    if valid_cfg["metric"] in DECODING_METRICS and not valid_cfg["decode"]:
        raise ConfigError(source, "validation.metric",
                          f"{valid_cfg['metric']!r} needs decoding, but validation.decode is false")
    if valid_cfg["metric"] == "aer" and not config["data"]["valid"].get("align"):
        raise ConfigError(source, "validation.metric", "'aer' (the alignment error rate) needs the validation pairs' "
                          "reference alignments: set data.valid.align")
    validation_search(valid_cfg, source)  # SearchOptions' checks, with validation.decode false too
    init_from.check_init_from(config, source)
    check_distill(config, source)
    check_guided_alignment(config, source)
    pretrained_embeddings.check_vector_files(config, source)
    return device


class Trainer:
    """Builds data, model, loss, optimizer and schedule from a resolved config; :meth:`train` runs.

    config: the dict returned by ``load_config`` (or ``resolve_config``), whose checks it relies on: a
    dict changed after them into an impossible lr schedule is ``build_schedule``'s ValueError naming
    the key; source: the config file name (errors);
    lock: the save_dir's lock when the caller already holds it (else it is taken here;
    DirectoryLockedError when another run holds it). It is released at the end of :meth:`train`.
    """

    def __init__(self, config: dict, source: str = "<config>", lock: DirectoryLock | None = None) -> None:
        self.config, self.source = config, source
        self.save_dir = Path(config["training"]["save_dir"])
        self.device = check_run_config(config, source)
        self.dist = init_distributed(self.device.type)  # one process unless started by torchrun
        self.device = rank_device(self.dist, self.device)
        make_current(self.device)  # one device per process (several processes: set already)
        if config["training"]["threads"] is not None:
            torch.set_num_threads(config["training"]["threads"])
        self.metric = config["validation"]["metric"]
        # the validation decode's search (None: validation.decode false), logged with the first validation
        self.search = validation_search(config["validation"], source) if config["validation"]["decode"] else None
        # one run per save_dir: held from here to the end of train() (DirectoryLockedError otherwise);
        # in a data-parallel job by rank 0 for all ranks
        self.lock = (lock or DirectoryLock(self.save_dir, RUN_LOCK_WHAT)).acquire() if self.dist.is_main else NullLock()
        try:
            self._setup()
        except BaseException:
            self.lock.release()
            raise

    def _setup(self) -> None:
        config, source = self.config, self.source
        train_cfg = config["training"]
        for stale in remove_stale_temporaries(self.save_dir) if self.dist.is_main else ():
            logger.info("removed %s (left by an interrupted save)", stale)

        checkpoint = self._existing_checkpoint()
        in_rank_order(self.dist, lambda: generate_if_missing(config["data"]))
        self.data_files = data_fingerprints(config["data"])  # saved with every checkpoint
        if checkpoint is not None:
            self._check_data_files(checkpoint)
        seed_everything(train_cfg["seed"])
        fields = None
        parent = init_from.load_parent(config, source, resuming=checkpoint is not None)  # fine-tuning
        if checkpoint is not None:
            fields = (Field.from_state_dict(checkpoint["src_field"]), Field.from_state_dict(checkpoint["tgt_field"]))
        elif parent is not None:  # the parent's fields, or extended by this data (training.init_vocab)
            fields = (init_from.extended_fields(parent, config) if train_cfg["init_vocab"] == "extend"
                      else parent.fields)
        self.data = self._load_data(fields)
        # data.extra_valid: monitored sets, read with the run's fields at every start (they may change between sessions)
        self.extra_valid = load_extra_validation(config["data"], self.data.src_field, self.data.tgt_field)
        self.train_set = self.data.train  # the examples batches index: this epoch's segmentation with subword sampling
        self.alignments = self.data.alignments  # guided alignment's references for train_set's segmentation
        self.noise = source_noise(config["data"], self.data, train_cfg["seed"])  # data.train[i].noise (None: off)
        if parent is not None and self.dist.is_main and train_cfg["init_vocab"] == "keep":
            init_from.warn_unknown_tokens(parent, self.data.train.unk_tokens)
        src_vocab, tgt_vocab = self.data.src_field.vocab, self.data.tgt_field.vocab
        self.pad, self.bos, self.eos = tgt_vocab.pad_index, tgt_vocab.bos_index, tgt_vocab.eos_index
        try:
            self.model = build_model(config["model"], len(src_vocab), len(tgt_vocab), pad_index=self.pad)
        except ModelConfigError as exc:  # the builder names the key; add the file
            raise ConfigError(source, exc.key, exc.problem) from None
        self._copy_vocabularies()
        check_valid_positions(self.data, config["data"], position_limits(self.model), self.extra_valid)
        set_activation_checkpointing(self.model, train_cfg["checkpoint_activations"])
        self._pretrained_embeddings(checkpoint is not None, parent is not None)
        try:  # training.freeze: before the optimizer is built, at every start
            freeze.freeze_parts(self.model, train_cfg["freeze"])
        except ValueError as exc:
            raise ConfigError(source, freeze.KEY, str(exc)) from None
        self.model.to(self.device)
        # training.distill: the teacher (each process its own copy), checked against this run's vocabularies
        self.teacher = load_teacher(config, source, self.data.src_field, self.data.tgt_field, self.device)
        changed = teacher_change(checkpoint["trainer"].get("teacher"), self.teacher) if checkpoint is not None else None
        if changed is not None and self.dist.is_main:
            logger.warning("training.distill.teacher: %s since %s was saved; distillation goes on with the "
                           "teacher as it is now", changed, self.resume_path)
        if self.dist.rank > 0:  # same initial weights on every rank, other dropout masks
            seed_everything(train_cfg["seed"] + self.dist.rank)
        output = config["model"]["output"]
        self.loss_fn = get_loss(output["mapping"], **output["params"])
        self.optimizer = build_optimizer(self.model.parameters(), train_cfg["optimizer"])
        self.precision = TrainPrecision(train_cfg["precision"], self.device)
        in_graph = train_cfg["compile_encoder"]
        self.loss_forward = (compile_loss_forward(self.device, encoder_in_graph=in_graph,
                                                  cuda_graphs=train_cfg["accumulate"] == 1) if train_cfg["compile"]
                             else loss_forward)
        coverage = train_cfg["coverage_loss"]  # training.coverage_loss: its weight (0: off)
        if coverage > 0:
            self.loss_forward = partial(self.loss_forward, coverage_weight=coverage)
        if self.teacher is not None:  # teacher and student forward in one (compiled) step
            self.loss_forward = DistillForward(self.teacher, (lambda fn: compile_for_device(
                fn, self.device, encoder_in_graph=in_graph, cuda_graphs=train_cfg["accumulate"] == 1))
                if train_cfg["compile"] else None, coverage)
        self.guide = guided_alignment(config, source, self.model)  # training.guided_alignment (None: off)
        if self.guide is not None:
            self.loss_forward = GuidedForward(self.guide, (lambda fn: compile_for_device(
                fn, self.device, encoder_in_graph=in_graph, cuda_graphs=train_cfg["accumulate"] == 1))
                if train_cfg["compile"] else None, teacher=self.teacher)
        self._guide_window: torch.Tensor | None = None  # the summed alignment loss since the last log line
        self.batch_statistics = (compile_for_device(batch_statistics, self.device, encoder_in_graph=in_graph)
                                 if train_cfg["compile"]
                                 else batch_statistics)
        # the run's own config, checked at load (check_lr_schedule), builds the schedule: neither a
        # resumed checkpoint's stored config nor an init_from parent's reaches it
        self.schedule = build_schedule(self.optimizer, train_cfg["optimizer"]["lr"], train_cfg["lr_schedule"],
                                       train_cfg["max_steps"])
        if parent is not None:  # the parent's weights (and optimizer state); all else starts fresh
            init_from.init_model(parent, self.model, config, source)
            self._copy_vocabularies()  # this run's vocabularies (init_vocab: extend has more types)
            if train_cfg["init_optimizer"]:
                pretrained_embeddings.check_init_optimizer(parent.payload["config"], config, source)
                freeze.check_init_optimizer(parent.payload["config"], config, source)
                init_from.init_optimizer(parent, self.optimizer, config, source)
            logger.info(init_from.describe(parent, train_cfg["init_optimizer"], fields))
        ema = train_cfg["ema"]  # the moving average of the weights (training.ema), from the weights now
        self.ema = WeightAverage(self.model, **ema) if ema["decay"] > 0 else None
        if self.dist.is_main:  # once the model is built (and holds the parent's weights): a refused run writes none
            write_run_vocabularies(self.save_dir, self.data.src_field, self.data.tgt_field, fresh=checkpoint is None)
        self.stopper = EarlyStopping(HIGHER_IS_BETTER[self.metric], train_cfg["early_stopping_patience"])
        # training.keep_best: the N best validations, ranked by early stopping's rule (best_step_N.pt files)
        self.kept = KeptBest(train_cfg["keep_best"], self.metric, self.stopper.is_better, self.stopper.higher_is_better)
        self.progress = Progress()
        self.nonfinite_skips = DroppedUpdates()  # updates dropped for a non-finite loss (training.nonfinite: skip)
        self.overflows = OverflowSkips()  # fp16 updates dropped for inf/NaN gradients (nmt.train.overflow)
        self.last_metrics: dict[str, Any] = {}
        self._signatures_logged = False  # the search and sacrebleu signatures are logged once per session
        self._tokens_per_sec = math.nan  # of the last logging window
        self._session_start: float | None = None  # perf_counter() when this session's loop began
        self._session_elapsed0 = 0.0
        self.resumed = checkpoint is not None
        self.saved_step: int | None = None  # the step last.pt holds (None: none written yet)
        if checkpoint is not None:
            self._restore(checkpoint)
            self.saved_step = self.progress.step
            for damaged in self._damaged:  # out of the rotation, nmt-average -last and best.pt; bytes kept
                logger.warning("%s: moved aside to %s (damaged)", damaged, set_aside_damaged(damaged).name)
            if self.dist.is_main and self.resume_path.name != "last.pt":  # last.pt was missing or damaged
                restore_last(self.save_dir, self.resume_path)
                logger.warning("last.pt replaced by %s (step %d), the checkpoint training continues from",
                               self.resume_path.name, self.progress.step)
            best = self.save_dir / "best.pt"
            # whether best.pt holds the recorded best: read once (one CRC pass, none where it is the file just loaded)
            best_holds = False
            if self.dist.is_main and best.is_file():
                damage, best_found = best_check(best, self.resume_path, self.progress.step)
                if damage is not None:  # not visited by the resume (older than its checkpoint): kept aside too
                    logger.warning("%s: %s; moved aside to %s (damaged)", best, damage, set_aside_damaged(best).name)
                best_holds = damage is None and best_found == self.stopper.best_step
            repaired = (repair_best(self.save_dir, self.progress.step, self.stopper.best_step, self.resume_path,
                                    holds=best_holds) if self.dist.is_main else None)
            if repaired is not None:
                logger.warning("best.pt repaired: it now holds step %d, the best %s records (from %s; a save was "
                               "interrupted or best.pt was damaged)", self.stopper.best_step, self.resume_path.name,
                               repaired.name)
            elif self.dist.is_main and self.stopper.best_step >= 0 and not best_holds:
                logger.warning("%s: does not hold step %d, the best %s records (damaged or missing), and no "
                               "checkpoint of that step remains to restore it from; the next validation that "
                               "improves on that best writes it", self.save_dir / "best.pt", self.stopper.best_step,
                               self.resume_path.name)
            if self.dist.is_main and self.kept.size > 0:  # the files the record names, and no others
                for line in restore_kept(self.save_dir, self.kept, self.progress.step, self.resume_path):
                    logger.warning("%s", line)
        self.nonfinite = NonFiniteGuard(self.device)
        self.train_model = wrap_model(self.model, self.dist)  # DistributedDataParallel with several processes
        if self.dist.enabled:
            logger.info("data parallel: %d processes x batch_size %d x accumulate %d = effective batch %d %s",
                        self.dist.world_size, train_cfg["batch_size"], train_cfg["accumulate"],
                        self.dist.world_size * train_cfg["batch_size"] * train_cfg["accumulate"], train_cfg["batch_type"])
        self.last_update_skipped = False  # whether train_step's last update was dropped
        n_params = sum(p.numel() for p in self.model.parameters())
        n_frozen = sum(p.numel() for p in self.model.parameters() if not p.requires_grad)
        copying = " copying source tokens" if self.model.copies else ""
        logger.info("model: %s, %d parameters%s; attention %s, output %s%s (loss: %s%s); device %s",
                    config["model"]["type"], n_params, f" ({n_frozen} frozen)" if n_frozen else "",
                    describe_attention(config["model"]), output["mapping"], copying,
                    loss_display_name(output["mapping"]), " at the cheapest target on the correct parts" if copying
                    else "", self.device)
        if self.teacher is not None and self.dist.is_main:
            logger.info(self.teacher.describe())
        if self.guide is not None and self.dist.is_main:
            logger.info(self.guide.describe())
        if self.ema is not None:
            ema = train_cfg["ema"]
            logger.info("ema: moving average of the weights, decay %g%s from step %d, every %d update(s); validation, "
                        "best.pt and the checkpoints' model are the average (raw_model: the trained weights)",
                        ema["decay"], " with warmup" if ema["warmup"] else "", ema["start_step"], ema["every"])
        if not self.resumed and self.dist.is_main:  # on resume config.yaml changes with the first checkpoint
            save_config(config, self.save_dir / "config.yaml")

    def _copy_vocabularies(self) -> None:
        """``model.output.copy``: each source type's target id from this run's vocabularies
        (:func:`nmt.models.copy_attention.source_to_target`; a checkpoint carries the table)."""
        if self.model.copies:
            src_vocab, tgt_vocab = self.data.src_field.vocab, self.data.tgt_field.vocab
            self.model.generator.copy.set_vocabularies(
                source_to_target(src_vocab.itos, tgt_vocab.stoi, tgt_vocab.unk_index, (PAD, BOS, EOS)))

    def _pretrained_embeddings(self, resuming: bool, fine_tuning: bool) -> None:
        """``model.embeddings.pretrained``: the vectors into the tables of a fresh run only (a resumed
        run's checkpoint and an init_from parent's weights win: the file is not read), then the
        freeze, at every start, before the optimizer is built (which then never holds a frozen table)."""
        model_cfg = self.config["model"]
        cfg = model_cfg["embeddings"]["pretrained"]
        files = [f"{pretrained_embeddings.KEY}.{side}" for side in ("src", "tgt") if cfg[side] is not None]
        if files and (resuming or fine_tuning):
            logger.info("%s: not read: %s", ", ".join(files), f"the run resumes from {self.save_dir}'s checkpoint"
                        if resuming else "training.init_from's weights win (the vectors are for a fresh start)")
        elif files:
            pretrained_embeddings.load_pretrained_embeddings(self.model, model_cfg, self.data.src_field.vocab,
                                                             self.data.tgt_field.vocab, self.source)
        frozen = pretrained_embeddings.freeze_embeddings(self.model, model_cfg)
        if frozen and not files and not resuming and not fine_tuning:
            logger.warning("%s: freezing a randomly initialised table (no vectors given, no training.init_from)",
                           pretrained_embeddings.KEY)

    def _load_data(self, fields: tuple[Field, Field] | None):
        """Training data; with several processes rank 0 builds the fields (and caches) first and
        the other ranks reuse its fields (a broadcast), so every rank encodes with the same ids."""
        alignments = guided_weight(self.config) > 0  # training.guided_alignment reads data.train.align
        data = in_rank_order(self.dist, lambda: load_training_data(self.config["data"], self.save_dir, fields,
                                                                     self.config["training"]["seed"], alignments)
                             if self.dist.is_main or fields is not None else None)
        if fields is None and self.dist.enabled:
            states = self.dist.broadcast((data.src_field.state_dict(), data.tgt_field.state_dict())
                                         if self.dist.is_main else None)
            shared = (Field.from_state_dict(states[0]), Field.from_state_dict(states[1]))
            data = in_rank_order(self.dist, lambda: data if self.dist.is_main
                                 else load_training_data(self.config["data"], self.save_dir, shared,
                                                        self.config["training"]["seed"], alignments))
        return data

    # ------------------------------------------------------------------ resume
    def _existing_checkpoint(self) -> dict | None:
        """The checkpoint to resume from (None: a new run): ``last.pt``, or when it is missing or
        damaged the newest older checkpoint that loads (a one-line warning per file passed over;
        CheckpointError when checkpoints exist but none loads). With several processes rank 0
        chooses and every rank loads its choice. Sets :attr:`resume_path`."""
        self.resume_path: Path | None = None
        self._damaged: list[Path] = []  # rank 0: the damaged checkpoints the resume passed over
        point, choice, failure = None, (None, None), None  # choice: (path to resume from, error), by rank 0
        if self.dist.is_main:
            try:
                point = find_resume_checkpoint(self.save_dir)
            except (CheckpointError, OSError) as exc:
                if not self.dist.enabled:
                    raise
                failure = exc  # raised below, once the other ranks know
            choice = (str(point.path) if point is not None else None,
                      (str(failure) or type(failure).__name__) if failure is not None else None)
        path, error = self.dist.broadcast(choice)
        if failure is not None:
            raise failure
        if error is not None:
            raise CheckpointError(error)
        if path is None:
            if self.dist.is_main:  # the other ranks write nothing there (on another node it may not be shared)
                self.save_dir.mkdir(parents=True, exist_ok=True)
            return None
        self.resume_path = Path(path)
        checkpoint = point.payload if point is not None else load_checkpoint(path)
        for problem in point.passed_over if point is not None else ():
            logger.warning("%s; resuming from %s (step %s) instead", problem, path, checkpoint.get("step"))
        self._damaged = point.damaged if point is not None else []  # set aside once the resume is vetted
        for key in resume_defaults(checkpoint["config"], self.config):  # a default changed since it was saved
            logger.info("%s: %r, as the run in %s was trained (it predates the option; new runs default to %r)",
                        key, config_value(self.config, key), self.save_dir, config_value(SCHEMA, key).default)
        differences = [key for key in config_differences(checkpoint["config"], self.config)
                       if not added_at_default(checkpoint["config"], self.config, key)]
        vetted = resume_check(checkpoint, self.config, self.dist, self.source)  # number of processes
        # a data file under another path (moved, or named relative instead of absolute) is the same
        # data when its content is: the checkpoint's fingerprint of it decides (_check_data_files)
        fingerprinted = checkpoint.get("trainer", {}).get("data_files") or {}
        vetted |= {key for key in DATA_FILE_KEYS if key in fingerprinted}
        # reference alignments shape the loss, not the batches: another file (or none) is a changed setting
        vetted |= {d for d in differences if d.startswith(("data.train", "data.valid")) and d.endswith(".align")}
        vetted |= set(pretrained_embeddings.NOT_READ_ON_RESUME)  # the checkpoint holds the weights
        vetted |= {d for d in differences if d.startswith("data.extra_valid")}  # monitored only: may come and go
        blocking = [d for d in differences
                    if any(d == k or d.startswith(k + ".") for k in RESUME_MUST_MATCH) and d not in vetted]
        if blocking:
            key = blocking[0]
            raise ConfigError(self.source, key, f"differs from the run in {self.save_dir} "
                              f"({saved_value(checkpoint['config'], key)!r} there); resume needs the same "
                              "model, data, seed and batching; use another training.save_dir")
        for key in RESUME_OPTIMIZER_MUST_MATCH:
            if key in differences:
                raise ConfigError(self.source, key, f"differs from the run in {self.save_dir} "
                                  f"({saved_value(checkpoint['config'], key)!r} there): its optimizer state would "
                                  "not fit; start a new run from its weights with training.init_from (another "
                                  "training.save_dir)")
        if differences:
            logger.info("resuming with changed settings: %s", ", ".join(differences))
        return checkpoint

    def _check_data_files(self, checkpoint: dict) -> None:
        """A data file that changed since ``checkpoint`` was written (its fingerprint there, see
        :func:`nmt.train.data_setup.data_fingerprints`) is a ConfigError naming the key and the file,
        or with ``training.resume_ignore_data_change`` a warning; a checkpoint without
        fingerprints (written before they were recorded) is not checked."""
        saved = checkpoint["trainer"].get("data_files")
        changes = data_changes(saved, self.data_files) if saved else []
        if not changes:
            return
        if self.config["training"]["resume_ignore_data_change"]:
            for key, path, what in changes:
                logger.warning("%s: %s changed since %s was saved (%s); resuming anyway "
                               "(training.resume_ignore_data_change): the vocabulary is the checkpoint's and the "
                               "data position indexes the new file's batches", key, path, self.resume_path, what)
            return
        key, path, what = changes[0]
        also = f"; also changed: {', '.join(k for k, _, _ in changes[1:])}" if len(changes) > 1 else ""
        raise ConfigError(self.source, key, f"{path} changed since the run in {self.save_dir} saved {self.resume_path.name} "
                          f"({what}){also}; its vocabulary and data position belong to the old file: restore it, "
                          "use another training.save_dir, or set training.resume_ignore_data_change: true")

    def _replay_validations(self, previous_metric: str, step: int) -> None:
        """Early stopping's best and patience rebuilt for ``validation.metric`` from the validations
        ``metrics.jsonl`` records up to the resumed ``step`` (each record holds every metric), as if
        the run had used this metric from its start; best.pt then follows the rebuilt best (the
        resume's repair restores it from a checkpoint of that step where one remains)."""
        key = f"valid_{self.metric}"
        records = [r for r in MetricsLog(self.save_dir / "metrics.jsonl").read()
                   if r.get("step", math.inf) <= step and key in r]
        self.stopper.replay((r["step"], math.nan if r[key] is None else float(r[key])) for r in records)
        found = (f"best {self.metric} {self.stopper.best:.4g} at step {self.stopper.best_step}"
                 if self.stopper.best_step >= 0 else f"no {self.metric} value among them")
        logger.warning("validation.metric is now %s (%s ranked the checkpoints so far): best.pt and early stopping "
                       "are rebuilt from the %d validations metrics.jsonl records up to step %d: %s",
                       self.metric, previous_metric, len(records), step, found)

    def _restore(self, checkpoint: dict) -> None:
        # with training.ema the checkpoint's "model" is the average, "raw_model" the trained weights
        self.model.load_state_dict(checkpoint.get("raw_model", checkpoint["model"]))
        if self.ema is not None and "ema" in checkpoint:
            self.ema.load_state_dict(checkpoint["ema"], checkpoint["model"])
        elif self.ema is not None:
            self.ema.reset()
            logger.warning("%s holds no moving average of the weights: training.ema starts it from the weights "
                           "of step %d", self.resume_path, checkpoint["step"])
        elif "ema" in checkpoint:
            logger.warning("%s holds a moving average of the weights, training.ema.decay is 0 now: training goes on "
                           "from the trained weights, and validation and checkpoints use them", self.resume_path)
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.schedule.load_state_dict(checkpoint["scheduler"])
        self.precision.load_state_dict(checkpoint.get("grad_scaler", {}))
        trainer_state = checkpoint["trainer"]
        self.stopper.load_state_dict(trainer_state["early_stopping"])
        previous_metric = checkpoint["config"]["validation"]["metric"]
        if previous_metric != self.metric:  # its best and patience speak of another metric: rebuilt
            self._replay_validations(previous_metric, checkpoint["step"])
        self.kept.load_state_dict(trainer_state.get("keep_best"))  # absent: saved before keep_best or by an older nmt
        self.progress = Progress(**trainer_state["progress"])
        self.nonfinite_skips.load_state_dict({"total": trainer_state.get("skipped_updates", 0),  # absent before
                                              "in_a_row": trainer_state.get("consecutive_skips", 0)})  # nmt recorded them
        self.overflows.load_state_dict(trainer_state.get("overflow_skips"))
        self.last_metrics = dict(checkpoint["metrics"])
        # last: building the model consumed random numbers
        set_rng_state(rank_rng_state(checkpoint, self.dist), self.device)
        logger.info("resumed from %s at step %d (epoch %d, batch %d)", self.resume_path,
                    self.progress.step, self.progress.epoch, self.progress.batch_in_epoch)

    def _payload(self) -> dict:
        ema = {} if self.ema is None else {  # "model": what to translate with; "raw_model": what to resume
            "weights": "ema", "raw_model": self.model.state_dict(), "ema": self.ema.state_dict()}
        return {
            "model": self.model.state_dict() if self.ema is None else self.ema.model_state(self.model),
            **ema,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "grad_scaler": self.precision.state_dict(),
            "step": self.progress.step,
            "epoch": self.progress.epoch,
            "rng": rng_state(self.device),
            "config": self.config,
            "src_field": self.data.src_field.state_dict(),
            "tgt_field": self.data.tgt_field.state_dict(),
            "metrics": self.last_metrics,
            "trainer": {"progress": asdict(self.progress), "early_stopping": self.stopper.state_dict(),
                        "keep_best": self.kept.state_dict(),
                        "data_files": self.data_files, "skipped_updates": self.skipped_updates,
                        "teacher": self.teacher.record() if self.teacher is not None else None,
                        "consecutive_skips": self.consecutive_skips,
                        "overflow_skips": self.overflows.state_dict()},
        }

    def save(self, is_best: bool = False, step_file: bool = True) -> None:
        """Write last.pt (and step_N.pt / best.pt / best_step_N.pt) to save_dir atomically (rank 0; every rank
        calls it: the RNG states of all ranks are gathered into the checkpoint).

        Raises NonFiniteLossError instead when a non-finite loss was seen or a parameter is
        not finite: a checkpoint never holds NaN / inf weights.
        """
        self.nonfinite.check(self.saved_step)
        check_parameters_finite(self.model.parameters(), self.progress.step, self.saved_step)
        if self._session_start is not None:  # up to now: the validation before this save included
            self.progress.elapsed = self._elapsed()
        states = self.dist.gather(rng_state(self.device))
        if self.dist.is_main:
            payload = self._payload()
            payload["trainer"]["distributed"] = distributed_state(self.dist, self.config, states)
            save_run_checkpoint(self.save_dir, payload, self.config["training"]["keep_last"], is_best, step_file,
                                kept_steps=self.kept.steps if self.kept.size > 0 else None)
            save_config(self.config, self.save_dir / "config.yaml")  # it describes the weights in save_dir
        self.saved_step = self.progress.step

    # ------------------------------------------------------------------ loop
    def _finished(self) -> str | None:
        cfg, p = self.config["training"], self.progress
        if cfg["max_steps"] is not None and p.step >= cfg["max_steps"]:
            return "max_steps"
        if cfg["max_epochs"] is not None and p.epoch >= cfg["max_epochs"]:
            return "max_epochs"
        if cfg["max_minutes"] is not None and self._elapsed() >= 60 * cfg["max_minutes"]:
            return "max_minutes"
        if self.stopper.should_stop:
            return "early_stopping"
        return None

    def _elapsed(self) -> float:
        """Training seconds over all sessions of the run, up to now."""
        if self._session_start is None:
            return self.progress.elapsed
        return self._session_elapsed0 + time.perf_counter() - self._session_start

    def train_step(self, indices: list[int] | list[list[int]]) -> tuple[torch.Tensor, int]:
        """One update on the training examples ``indices`` (one batch, or a list of batches whose
        gradients are accumulated: ``training.accumulate``); returns (summed loss, detached; target tokens).

        With several processes ``indices`` is the global batch: each rank takes its part, the
        loss is normalised by the target tokens (or sentences: ``training.normalization``) of all
        ranks, and the returned loss and token
        count are those of all ranks (so every rank sees, and stops on, the same non-finite loss).

        A non-finite loss raises NonFiniteLossError (``training.nonfinite: stop``; on an
        accelerator at the next logging/validation/save point) or drops the update (``skip``:
        the returned loss is 0 and the token count 0, so the logged mean covers applied updates;
        :attr:`last_update_skipped` is True and the lr schedule is not advanced: as in fairseq, a
        dropped update is not an update, and the caller does not count it as a step either).
        :data:`MAX_CONSECUTIVE_SKIPS` dropped in a row raise NonFiniteLossError.

        fp16: an update whose gradients overflow at the current loss scale is dropped the same
        way (not a step, the schedule stays; counted in :attr:`overflows`, saved in last.pt);
        :data:`nmt.train.overflow.MAX_CONSECUTIVE_OVERFLOWS` in a row raise GradientOverflowError.
        """
        cfg = self.config["training"]
        groups = [indices] if len(indices) and np.isscalar(indices[0]) else list(indices)  # accumulated batches
        parts = [shard_batch(group, self.dist.rank, self.dist.world_size) for group in groups]
        batches = []
        for part, real in parts:
            host = collate(self.train_set, part, self.pad, self.bos, self.eos)
            if self.noise is not None:  # data.train[i].noise: this epoch's noise on the sources
                host = self.noise.apply(host, self.train_set, self.progress.epoch)
            host = pad_to_multiple(host, cfg["pad_to_multiple"], self.pad)
            if self.guide is not None and self.alignments is not None:  # the reference grid (B, T, L)
                lines = [self.train_set.line_numbers[i] for i in part] if real else []  # a stand-in: no loss
                host = replace(host, align=self.alignments.reference(lines, host.tgt_in.size(1), host.src.size(1),
                                                                     rows=len(part)))
            batches.append(host.to(self.device, lengths_on_host=True))
        skip = cfg["nonfinite"] == "skip"
        # target tokens and sentences of all batches of all ranks: host ints over Gloo, no device sync
        n_tokens, n_sents = self.dist.sum_ints([sum(b.n_tokens for b, (_, real) in zip(batches, parts) if real),
                                                sum(len(b) for b, (_, real) in zip(batches, parts) if real)])
        divisor = n_tokens if cfg["normalization"] == "tokens" else n_sents  # training.normalization
        scales = None if not self.dist.enabled else [self.dist.world_size / max(divisor, 1) if real else 0.0
                                                     for _, real in parts]
        loss, _, skipped = update(self.train_model, self.loss_fn, self.optimizer, batches, self.pad,
                                  cfg["clip_grad_norm"], cfg["label_smoothing"], skip_nonfinite=skip,
                                  loss_scale=scales, all_ranks=self.dist.all_true if self.dist.enabled else None,
                                  precision=self.precision, forward=self.loss_forward,
                                  normalization=cfg["normalization"])
        if self.dist.enabled:  # the summed loss of all ranks (an all-reduce on the device, no host sync)
            loss = self.dist.sum_tensor_(loss.clone())
        guide = self.loss_forward.take() if self.guide is not None else None  # this update's alignment loss
        if guide is not None and skipped is None:
            guide = self.dist.sum_tensor_(guide.clone()) if self.dist.enabled else guide
            self._guide_window = guide if self._guide_window is None else self._guide_window + guide
        self.last_update_skipped = skipped is not None
        if skipped == "overflow":  # fp16: not an update either (the schedule and the step stay)
            self.overflows.record(self.progress.step + 1, self.saved_step, self._loss_scale)
            return torch.zeros_like(loss), 0
        if skipped is not None and not skip:  # fp16 read the flag: nonfinite: stop stops here
            self.nonfinite.observe(loss, self.progress.step + 1)
            self.nonfinite.check(self.saved_step)
        if skipped is not None:  # not an update: the schedule (and the trainer's step) stay where they are
            self.nonfinite_skips.drop()
            logger.warning("step %d: non-finite training loss (%s) or gradient norm; update skipped and not "
                           "counted (training.nonfinite: skip; %d skipped so far)", self.progress.step + 1,
                           float(loss), self.skipped_updates)
            if self.consecutive_skips >= MAX_CONSECUTIVE_SKIPS:
                raise NonFiniteLossError(
                    f"step {self.progress.step + 1}: {self.consecutive_skips} updates in a row skipped for a "
                    f"non-finite loss or gradient norm; stopped ({kept_state(self.saved_step)}); lower "
                    "training.optimizer.lr, set training.clip_grad_norm, or check the data")
            return torch.zeros_like(loss), 0
        self.overflows.applied()
        self.nonfinite_skips.applied()
        if self.ema is not None:  # applied updates only (device ops, no host read)
            self.ema.update(self.progress.step + 1)
        self.schedule.step()
        if not skip:
            self.nonfinite.observe(loss, self.progress.step + 1)
            if self.nonfinite.sync_each_step:  # CPU: no sync to avoid
                self.nonfinite.check(self.saved_step)
        return loss, n_tokens

    @property
    def skipped_updates(self) -> int:
        """Updates dropped for a non-finite loss (``training.nonfinite: skip``), over all sessions of the run."""
        return self.nonfinite_skips.total

    @property
    def consecutive_skips(self) -> int:
        """Of them, those in a row up to now (a save may fall in a row)."""
        return self.nonfinite_skips.in_a_row

    def _alignment_loss(self, tokens: int) -> dict[str, float]:
        """``{"alignment_loss": per target token}`` of the updates since the last call (guided
        alignment; one host read, at a log line), reset; ``{}`` without guided alignment."""
        if self._guide_window is None:
            return {}
        value, self._guide_window = self._guide_window.item() / max(tokens, 1), None
        return {"alignment_loss": value}

    def _loss_scale(self) -> float:
        """The fp16 loss scale now (one host read; NaN without loss scaling)."""
        scale = self.precision.scale()
        return float(scale) if scale is not None else math.nan

    def _scaling(self) -> dict[str, float]:
        """fp16: ``{"loss_scale", "overflow_skips"}`` now (one host read), for logs and metrics; else {}."""
        if self.precision.scaler is None:
            return {}
        return {"loss_scale": self._loss_scale(), "overflow_skips": self.overflows.total}

    def train(self, step_hook: Callable[[int], None] | None = None) -> TrainSummary:
        """Train until max_steps / max_epochs / early stopping / SIGINT / SIGTERM; returns the summary.

        step_hook(step) is called after every update (tests use it to send signals). The
        save_dir lock is released at the end (also on an error).
        """
        try:
            return self._train(step_hook)
        finally:
            self.lock.release()

    def _train(self, step_hook: Callable[[int], None] | None) -> TrainSummary:
        from tqdm import tqdm

        cfg = self.config["training"]
        p = self.progress
        main = self.dist.is_main  # only rank 0 writes logs, metrics and TensorBoard
        # events past the checkpoint are dropped from the display: those of a killed session, and on
        # a fresh start (no last.pt) all those of an attempt killed before its first checkpoint
        # (metrics.jsonl is restarted likewise below)
        tb = TensorBoardWriter(self.save_dir / "tensorboard", cfg["tensorboard"] and main, purge_step=p.step + 1)
        metrics_log = MetricsLog(self.save_dir / "metrics.jsonl")
        if main and self.resumed:
            metrics_log.truncate_after(p.step)
        elif main:
            metrics_log.path.unlink(missing_ok=True)
        self.model.train()
        window_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        window_tokens, window_start = 0, time.perf_counter()
        session_start, session_elapsed0 = time.perf_counter(), p.elapsed
        self._session_start, self._session_elapsed0 = session_start, session_elapsed0
        # disable=None: no bar where stderr is not a terminal (a redirected log would fill with carriage returns)
        bar = tqdm(total=cfg["max_steps"], initial=p.step, disable=None if (cfg["progress"] and main) else True, unit="step",
                   dynamic_ncols=True, desc="train")
        stopped_by = self.dist.agree_stop(self._finished())
        with GracefulInterrupt() as interrupt:
            while stopped_by is None:
                # the global batches of all ranks: batch_size x processes (see nmt.train.distributed)
                segmenting = time.perf_counter()
                self.train_set = self._epoch_train_set(p.epoch)
                window_start += time.perf_counter() - segmenting  # tokens/s: training time only (as after validation)
                order = make_batch_order(self.train_set, cfg["batch_size"] * self.dist.world_size,
                                         cfg["batch_type"], shuffle=True, seed=cfg["seed"], epoch=p.epoch,
                                         bucket_size=cfg["bucket_size"], pool_sort=cfg["pool_sort"])
                while p.batch_in_epoch < len(order):
                    groups = order[p.batch_in_epoch:p.batch_in_epoch + cfg["accumulate"]]
                    loss, n_tokens = self.train_step(groups)
                    p.batch_in_epoch += len(groups)  # a dropped update consumed its batches too
                    if self.last_update_skipped:  # not a step: no log, validation or hook; a signal still stops
                        stopped_by = self.dist.agree_stop(interrupt.requested or self._finished())
                        if stopped_by is not None:
                            break
                        continue
                    p.step += 1
                    window_loss += loss
                    window_tokens += n_tokens
                    bar.update(1)
                    if p.step % cfg["log_every"] == 0 or p.step % cfg["valid_every"] == 0:
                        p.elapsed = session_elapsed0 + time.perf_counter() - session_start
                        self.nonfinite.check(self.saved_step)  # the window loss is read here anyway
                        mean = window_loss.item() / max(window_tokens, 1)
                        speed = window_tokens / max(time.perf_counter() - window_start, 1e-9)
                        p.valid_loss_sum += mean * window_tokens
                        p.valid_tokens += window_tokens
                        bar.set_postfix(loss=f"{mean:.4f}", tok_s=f"{speed:.0f}", lr=f"{self.schedule.lr:.2g}")
                        scaling = self._scaling()  # fp16 only
                        aligned = self._alignment_loss(window_tokens)  # guided alignment: its part, per token
                        tb.scalars("train", {"loss": mean, "lr": self.schedule.lr, "tokens_per_sec": speed,
                                             **scaling, **aligned}, p.step)
                        logger.info("step %d (epoch %d): train loss %.4f%s, lr %.3g, %.0f tokens/s, elapsed %.0fs%s",
                                    p.step, p.epoch, mean,
                                    f" (alignment loss {aligned['alignment_loss']:.4f} x {self.guide.weight:g})"
                                    if aligned else "", self.schedule.lr, speed, p.elapsed,
                                    f", loss scale {scale_text(scaling['loss_scale'])} ({scaling['overflow_skips']} "
                                    "overflow skips)" if scaling else "")
                        self._tokens_per_sec = speed
                        window_loss.zero_()
                        window_tokens, window_start = 0, time.perf_counter()
                    if p.step % cfg["valid_every"] == 0:
                        p.elapsed = session_elapsed0 + time.perf_counter() - session_start
                        self._validate(tb, metrics_log, regular=True)
                        window_start = time.perf_counter()
                    if step_hook is not None:
                        step_hook(p.step)
                    stopped_by = self.dist.agree_stop(interrupt.requested or self._finished())
                    if stopped_by is not None:
                        break
                if p.batch_in_epoch >= len(order):
                    p.epoch += 1
                    p.batch_in_epoch = 0
                    stopped_by = stopped_by or self.dist.agree_stop(self._finished())
            bar.close()
            p.elapsed = session_elapsed0 + time.perf_counter() - session_start
            p.valid_loss_sum += window_loss.item()  # the unlogged tail of the training-loss window
            p.valid_tokens += window_tokens
            if stopped_by.startswith("SIG"):
                self.save(step_file=False)
            elif p.last_validation_step != p.step:
                self._validate(tb, metrics_log, regular=False)
        tb.close()
        summary = TrainSummary(p.step, p.epoch, self.stopper.best_step, self.metric, self.stopper.best, p.elapsed,
                               stopped_by, str(self.save_dir))
        logger.info(summary.line())
        return summary

    def _epoch_train_set(self, epoch: int):
        """The training examples of ``epoch``: the data's one segmentation, or with subword
        sampling that epoch's (a function of training.seed and the epoch: the same on every rank
        and after a resume), logged with its kept / skipped pairs, ``<unk>`` share and time; with
        several corpora (``data.train`` a list) each corpus's examples weight times
        (:class:`nmt.data.corpora.CorpusWeights`, also a function of (training.seed, epoch))."""
        examples = self._epoch_segmentation(epoch)
        if self.data.weights is None:
            return examples
        return self.data.weights.for_epoch(examples, self.config["training"]["seed"], epoch)

    def _epoch_segmentation(self, epoch: int):
        resampled = self.data.resampled
        if resampled is None:
            return self.data.train
        self.train_set = self.data.train  # the previous epoch's segmentation freed before the next one is made
        start = time.perf_counter()
        train = resampled.for_epoch(self.config["training"]["seed"], epoch)
        if len(train) == 0:
            raise DataError(f"epoch {epoch}: subword sampling left no training pair: all {train.n_input} dropped "
                            f"({describe_skipped(train.skipped)}); loosen {resampled.pair_filter.describe()}")
        aligned = ""
        if self.guide is not None and self.data.alignments is not None:  # the references of this segmentation
            self.alignments = self.data.alignments.for_segmentation(train, self.data.src_field, self.data.tgt_field)
            aligned = (f"; alignments: {len(self.alignments)} pairs"
                       + (f", {self.alignments.n_mismatched} without (a piece read back as <unk> changed a word "
                          f"count; first: {self.alignments.mismatched[0]})" if self.alignments.mismatched else ""))
        if self.dist.is_main:
            logger.info("epoch %d segmentation (subword sampling, %.2fs): %s%s", epoch, time.perf_counter() - start,
                        train.summary(), aligned)
        return train

    def _validate(self, tb: TensorBoardWriter, metrics_log: MetricsLog, regular: bool) -> None:
        """Validate, log (metrics.jsonl, TensorBoard, logger), update lr / best, and checkpoint.

        regular=False (the extra validation at the end of a run, off the valid_every grid) may
        update best.pt but leaves the lr schedule and the patience alone, so extending a
        finished run gives the same result as running longer in the first place.
        """
        vcfg, p = self.config["validation"], self.progress
        self.nonfinite.check(self.saved_step)  # never validate (or save) a model that met a NaN loss
        settings = dict(batch_size=vcfg["batch_size"], device=self.device,
                        is_softmax=is_softmax(self.config["model"]["output"]["mapping"]), search=self.search,
                        statistics=self.batch_statistics, pad_multiple=self.config["training"]["pad_to_multiple"],
                        metrics=vcfg["metrics"], ranks=self.dist)
        extra: dict[str, dict[str, float] | None] = {}
        with self._validated_weights():  # every rank its share of the batches; rank 0 gets the result
            result = validate(self.model, self.data.valid, self.data.valid_references, self.loss_fn, **settings)
            for monitored in self.extra_valid:  # data.extra_valid: the same figures, for the log only
                other = validate(self.model, monitored.dataset, monitored.references, self.loss_fn, **settings)
                extra[monitored.name] = other.scalars if other is not None else None
            if self.dist.is_main:  # the other ranks wait for its scalars (lr decay and early stopping use them)
                if self.data.valid_alignments is not None:  # data.valid.align: the alignment error rate
                    result.scalars["aer"] = validation_aer(self.model, self.data.valid, self.data.valid_alignments,
                                                           self.data.src_field, self.data.tgt_field, self.pad,
                                                           self.bos, self.eos, self.device, vcfg["batch_size"])
        scalars = self.dist.broadcast(result.scalars if result is not None else None)
        value = scalars[self.metric]
        is_best = self.stopper.update(value, p.step, count=regular)
        self.kept.offer(p.step, value)  # training.keep_best (none kept with 0)
        decayed = self.schedule.on_validation(scalars["loss"]) if regular else False
        train_loss = p.valid_loss_sum / p.valid_tokens if p.valid_tokens else math.nan
        record = {"step": p.step, "epoch": p.epoch, "lr": self.schedule.lr, "train_loss": train_loss,
                  **{f"valid_{k}": v for k, v in scalars.items()},
                  **{f"valid_{name}_{k}": v for name, figures in extra.items() for k, v in (figures or {}).items()},
                  "tokens_per_sec": self._tokens_per_sec, "elapsed": round(p.elapsed, 3),
                  "best": is_best}
        if self.skipped_updates:
            record["skipped_updates"] = self.skipped_updates
        record |= self._scaling()  # fp16: the scale and the updates dropped for overflow so far
        if self.dist.is_main:
            with self._validated_weights():
                alphas = self._learned_alphas(tb)
                self._heatmaps(tb)
            if alphas:
                record["alphas"] = alphas
            metrics_log.append(record)
            tb.scalars("valid", scalars, p.step)
            for name, figures in extra.items():
                tb.scalars(f"valid_{name}", figures, p.step)
            tb.flush()
            shown = " ".join(f"{k}={v:.4g}" for k, v in scalars.items() if k != "tokens")
            logger.info("step %d valid%s: %s%s%s", p.step, " (ema weights)" if self.ema is not None else "", shown,
                        " (new best)" if is_best else "",
                        f"; lr decayed to {self.schedule.lr:.3g}" if decayed else "")
            for name, figures in extra.items():
                logger.info("step %d valid %s: %s", p.step, name,
                            " ".join(f"{k}={v:.4g}" for k, v in figures.items() if k != "tokens"))
            if self.search is not None and not self._signatures_logged:
                shown_metrics = ", ".join(m.replace("_", " ") for m in vcfg["metrics"])
                logger.info("valid decoding (its %scertified): %s", f"{shown_metrics} and " if shown_metrics else "",
                            search_description(self.search))
                if result.signatures:
                    logger.info("valid %s: sacrebleu %s", " / ".join(result.signatures),
                                " / ".join(result.signatures.values()))
                self._signatures_logged = True
            for i, hyp in enumerate(result.hypotheses[: min(2, len(result.hypotheses))]):
                logger.info("  example %d: hyp %r ref %r", i, hyp, self.data.valid_references[i])
        p.last_validation_step = p.step
        p.valid_loss_sum, p.valid_tokens = 0.0, 0
        self.last_metrics = {k: v for k, v in record.items()}
        self.save(is_best=is_best)

    def _validated_weights(self) -> AbstractContextManager[None]:
        """The context in which validation runs: the moving average in the model's parameters
        (``training.ema``; the trained weights restored bit for bit after it), else nothing."""
        return self.ema.swapped() if self.ema is not None else nullcontext()

    def _learned_alphas(self, tb: TensorBoardWriter) -> dict[str, list[list[float]]]:
        """Learned entmax alphas per attention kind, [layer][head]: logged, and in TensorBoard as
        ``alpha/<kind>/layer<i>/head<h>`` scalars and an ``alpha/<kind>/layer<i>`` histogram."""
        learned = getattr(self.model, "learned_alphas", None)
        if learned is None:
            return {}
        out = {kind: values.cpu().tolist() for kind, values in learned().items()}
        for kind, layers in out.items():
            for i, heads in enumerate(layers):
                tb.scalars(f"alpha/{kind}/layer{i}", {f"head{h}": a for h, a in enumerate(heads)}, self.progress.step)
                tb.histogram(f"alpha/{kind}/layer{i}", heads, self.progress.step)
            logger.info("  learned alphas, %s: %s", kind,
                        " | ".join(" ".join(f"{a:.2f}" for a in heads) for heads in layers))
        return out

    def _heatmaps(self, tb: TensorBoardWriter) -> None:
        n = min(self.config["validation"]["n_heatmaps"], len(self.data.valid))
        if tb.writer is None or n == 0:
            return
        for i, (matrix, src_tokens, tgt_tokens) in enumerate(
                attention_matrices(self.model, self.data.valid, list(range(n)), self.device)):
            title = attention_title(i, f"training step {self.progress.step}", teacher_forced=True)
            tb.attention(f"attention/valid_{i}", matrix.numpy(), src_tokens, tgt_tokens, self.progress.step, title)
        for i, (grid, src_tokens, tgt_tokens) in enumerate(
                attention_grids(self.model, self.data.valid, list(range(n)), self.device)):
            title = attention_title(i, f"training step {self.progress.step}", teacher_forced=True)
            tb.attention_grid(f"attention_layers_heads/valid_{i}", grid.numpy(), src_tokens, tgt_tokens,
                              self.progress.step, title)



def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


__all__ = ["Trainer", "check_run_config", "TrainSummary", "Progress", "resolve_device"]
