"""The Tuner: DPO on the user's A/B choices, LoRA adapters, promotion on held-out accuracy.

Every `mas pick` stores the chosen variation's prompt against each rejected one for the same concept
(`ab_selections`). `tune` turns those into DPO pairs and trains a LoRA adapter on a small causal LM
(MAS_PREFERENCE_BASE_MODEL_PATH) with trl's DPOTrainer: through Unsloth's fast path when CUDA and Unsloth
are there, plain peft + trl otherwise. DPO makes the adapter a reward model for free: the implicit reward
β·(log π(prompt | concept) − log π_ref(prompt | concept)) ranks prompts the way the user chose them
(Rafailov et al. 2023), with the base model (adapter disabled) as π_ref. That reward, through a sigmoid,
is the `preference` axis of DQA.

Everything is per user (the `Actor` a tune is for): their picks, their adapters, their pairwise taste. A tune first
fits the user's pairwise taste (`mas.learning.promotion`, a fraction of a second on the CPU, no GPU turn), then,
when a base model is configured, trains a DPO adapter inside a GPU turn. Each trained adapter gets the next
version in `trained_adapters`. It is promoted only if it predicts held-out choices at least as well as the
user's promoted adapter does on the same choices (the first one: at least as well as a coin flip). Held-out
choices are the user's every `heldout_every`-th pick (`held_out`): a pick is held out once and for all, so no
adapter ever trains on the choices it is judged by, and two adapters are always judged on the same ones.
(The pairwise taste is cheap enough to cross-validate instead and judges on every pick.) The model itself,
which grading shares, is in `gpu.preference_model`.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import sqlalchemy as sa
import torch

from gpu.preference_model import (
    METADATA_FILE,
    PROMPT_TEMPLATE,
    PreferenceModel,
    PreferencePair,
    PromotedAdapter,
    preference_base,
    promoted_adapter,
)
from mas import locks, names
from mas.config import Settings
from mas.db import ready_engine, session_scope
from mas.domain.identity import Actor
from mas.learning.promotion import TasteReport, tune_taste
from mas.models import ABSelection, TrainedAdapter

HELDOUT_EVERY = 4
"""Every 4th pick of a user is held out to judge DPO adapters."""


def held_out(position: int, *, every: int = HELDOUT_EVERY) -> bool:
    """Whether the pick at `position` (0-based, in the user's pick order) is held out."""
    return position % every == every - 1


@dataclass(kw_only=True)
class TunerConfig:
    """How the Tuner trains and judges adapters; the defaults suit a 1-8B base model on one GPU."""

    beta: float = field(
        default=0.1,
        metadata={
            "help": "DPO β: higher keeps the adapter closer to the base model. Also scales the implicit "
            "reward the preference axis is computed from."
        },
    )
    learning_rate: float = field(default=5e-5, metadata={"help": "AdamW learning rate of the LoRA weights."})
    epochs: float = field(default=3.0, metadata={"help": "Passes over the training pairs."})
    batch_size: int = field(default=8, metadata={"help": "Pairs per optimisation step."})
    max_length: int = field(
        default=256,
        metadata={"help": "Tokens kept of concept + prompt (the start is kept, like trl's keep_start)."},
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (scale = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA path (peft path only)."})
    target_modules: str | tuple[str, ...] = field(
        default="all-linear",
        metadata={"help": "Modules that get LoRA weights: peft's 'all-linear', or module names."},
    )
    gradient_checkpointing: bool = field(
        default=True, metadata={"help": "Trade compute for activation memory (off for tiny models)."}
    )
    use_unsloth: bool = field(
        default=True, metadata={"help": "Use Unsloth's kernels when CUDA is available and unsloth is installed."}
    )
    load_in_4bit: bool = field(
        default=True, metadata={"help": "QLoRA: load the base model in 4 bits (Unsloth path only)."}
    )
    min_accuracy: float = field(
        default=0.5,
        metadata={"help": "Held-out accuracy a first adapter needs to be promoted when none is: a coin flip."},
    )
    heldout_every: int = field(
        default=HELDOUT_EVERY,
        metadata={"help": "Every N-th A/B selection (in id order) is held out to judge adapters, never trained on."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of LoRA initialisation and data order."})

    def __post_init__(self) -> None:
        if self.heldout_every < 2:
            raise ValueError("heldout_every must be at least 2, or nothing is left to train on")


UNSLOTH_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Unsloth wants module names; these are the Llama-family projections it has fused kernels for."""


@dataclass(frozen=True, kw_only=True)
class TuneReport:
    """What `tune` did for one user, for `mas tune` to print and the beat job to log: the pairwise taste
    (`taste`) and the DPO adapter (the other fields)."""

    user: str
    taste: TasteReport | None
    trained: bool
    promoted: bool
    reason: str
    pairs: int
    train_pairs: int
    heldout_pairs: int
    needed_pairs: int
    version: int | None = None
    path: str | None = None
    backend: str | None = None
    heldout_accuracy: float | None = None
    current_version: int | None = None
    current_accuracy: float | None = None
    seconds: float = 0.0


class _Counts(TypedDict):
    """The pair counts every TuneReport carries."""

    user: str
    pairs: int
    train_pairs: int
    heldout_pairs: int
    needed_pairs: int


# --- data ------------------------------------------------------------------------------------------


def load_pairs(settings: Settings, actor: Actor) -> list[PreferencePair]:
    """Every (chosen, rejected) pair of `actor.user`'s picks, in selection id order; blank prompts skipped."""
    with session_scope(settings) as session:
        rows = session.execute(
            sa.select(ABSelection.id, ABSelection.concept, ABSelection.chosen_prompt, ABSelection.rejected_prompts)
            .where(ABSelection.user_name == actor.user)
            .order_by(ABSelection.id)
        ).all()
    return [
        PreferencePair(selection_id=sid, concept=concept, chosen=chosen, rejected=rejected)
        for sid, concept, chosen, rejected_prompts in rows
        for rejected in rejected_prompts
        if chosen.strip() and str(rejected).strip() and rejected != chosen
    ]


def split_heldout(pairs: Sequence[PreferencePair], *, every: int) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, held out): all pairs of every `every`-th selection, by position in id order, are held out."""
    order = {sid: i for i, sid in enumerate(dict.fromkeys(p.selection_id for p in pairs))}
    heldout = [p for p in pairs if held_out(order[p.selection_id], every=every)]
    train = [p for p in pairs if not held_out(order[p.selection_id], every=every)]
    return train, heldout


def dpo_rows(pairs: Sequence[PreferencePair]) -> list[dict[str, str]]:
    """trl's standard (non-conversational) preference format."""
    return [
        {"prompt": PROMPT_TEMPLATE.format(concept=p.concept), "chosen": " " + p.chosen, "rejected": " " + p.rejected}
        for p in pairs
    ]


# --- training ---------------------------------------------------------------------------------------


def fast_path_available() -> bool:
    """Unsloth needs CUDA; it is looked for, never imported, until the GPU training path runs."""
    return torch.cuda.is_available() and importlib.util.find_spec("unsloth") is not None


def train_adapter(*, base: Path, pairs: Sequence[PreferencePair], output: Path, config: TunerConfig) -> dict[str, Any]:
    """Train a DPO LoRA adapter on `pairs` and save it to `output` (written whole, then renamed into place).

    Returns training metrics. The reference model is the base with the adapter disabled, so no second copy
    of the model is loaded.
    """
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import DPOConfig, DPOTrainer

    cuda = torch.cuda.is_available()
    started = time.monotonic()
    model, tokenizer, peft_config, backend = _trainable(base, config)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    with tempfile.TemporaryDirectory(prefix="mas-dpo-") as scratch:
        args = DPOConfig(
            output_dir=scratch,
            beta=config.beta,
            learning_rate=config.learning_rate,
            num_train_epochs=config.epochs,
            per_device_train_batch_size=config.batch_size,
            max_length=config.max_length,
            gradient_checkpointing=config.gradient_checkpointing,
            bf16=cuda and torch.cuda.is_bf16_supported(),
            use_cpu=not cuda,
            seed=config.seed,
            save_strategy="no",
            report_to="none",
            logging_strategy="no",  # the summary at the end still logs the metrics averaged over training
            disable_tqdm=True,
        )
        trainer = DPOTrainer(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(dpo_rows(pairs)),
            processing_class=tokenizer,
            peft_config=peft_config,
        )
        trainer.remove_callback(PrinterCallback)  # the TuneReport is the output; keep worker logs readable
        result = trainer.train()
        partial = output.with_name(output.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        # trl's peft model, which transformers types as any nn.Module (or None)
        trainer.model.save_pretrained(partial)  # type: ignore[union-attr, operator]
        meta = {
            "beta": config.beta,
            "max_length": config.max_length,
            "template": PROMPT_TEMPLATE,
            "base_model": str(base.resolve()),
            "backend": backend,
        }
        (partial / METADATA_FILE).write_text(json.dumps(meta, indent=2))
        os.replace(partial, output)
        logged = [row for row in trainer.state.log_history if "rewards/accuracies" in row]
    del trainer, model
    _release()
    return {
        "backend": backend,
        "train_loss": float(result.training_loss),
        "train_reward_accuracy": float(logged[-1]["rewards/accuracies"]) if logged else None,  # mean over training
        "train_seconds": round(time.monotonic() - started, 2),
        "train_pairs": len(pairs),
        "config": asdict(config),
    }


def _trainable(base: Path, config: TunerConfig) -> tuple[Any, Any, Any, str]:
    """(model, tokenizer, peft config or None, backend name): Unsloth's QLoRA model when it can run, else
    the plain model with a peft LoraConfig for trl to wrap."""
    if config.use_unsloth and fast_path_available():
        import unsloth
        from unsloth import FastLanguageModel

        patch = getattr(unsloth, "PatchDPOTrainer", None)  # older releases patch trl's DPO only on request
        if patch is not None:
            patch()
        model, tokenizer = FastLanguageModel.from_pretrained(
            model_name=str(base),
            max_seq_length=config.max_length,
            dtype=None,
            load_in_4bit=config.load_in_4bit,
            local_files_only=True,
        )
        targets = UNSLOTH_TARGET_MODULES if config.target_modules == "all-linear" else list(config.target_modules)
        model = FastLanguageModel.get_peft_model(
            model,
            r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=0.0,
            target_modules=list(targets),
            use_gradient_checkpointing="unsloth" if config.gradient_checkpointing else False,
            random_state=config.seed,
        )
        return model, tokenizer, None, "unsloth"
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    torch.manual_seed(config.seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    modules = config.target_modules if isinstance(config.target_modules, str) else list(config.target_modules)
    lora = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=modules,
        task_type="CAUSAL_LM",
    )
    return model, tokenizer, lora, "peft"


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- tune: the whole job ----------------------------------------------------------------------------


def tune(
    settings: Settings,
    actor: Actor,
    *,
    dry_run: bool = False,
    config: TunerConfig | None = None,
    gpu_turn: Callable[[], AbstractContextManager] = nullcontext,
) -> TuneReport:
    """Fit `actor.user`'s pairwise taste and, when a base model is configured, train a DPO adapter on their
    picks; each is promoted or not by its own rule. With too few pairs, or `dry_run`, it says what it would do
    and trains nothing. `gpu_turn()` is held around DPO training and judging only, the part that uses the GPU
    (the gpu worker passes one of its turns). `mas tune [--user NAME] [--dry-run]` prints the report; the beat
    job logs it.
    """
    config = config or TunerConfig()
    started = time.monotonic()
    pairs = load_pairs(settings, actor)
    train, heldout = split_heldout(pairs, every=config.heldout_every)
    counts: _Counts = {
        "user": actor.user,
        "pairs": len(pairs),
        "train_pairs": len(train),
        "heldout_pairs": len(heldout),
        "needed_pairs": settings.quality.min_preference_pairs,
    }
    if len(pairs) < settings.quality.min_preference_pairs or not train or not heldout:
        reason = (
            f"{actor.user}: {len(pairs)} preference pairs from A/B choices; {settings.quality.min_preference_pairs} needed "
            f"(MAS_MIN_PREFERENCE_PAIRS), with at least {config.heldout_every} choices so one can be held out. "
            "The studio default serves this user meanwhile (no preference: every variation expected equally, "
            "no preference axis in grading). Run more A/B tests and pick winners (`mas pick`), then tune "
            "again. Nothing was trained."
        )
        if settings.quality.preference_base_model_path is None:
            reason += " DPO adapters also need MAS_PREFERENCE_BASE_MODEL_PATH (a local causal LM), which is not set."
        return TuneReport(taste=None, trained=False, promoted=False, reason=reason, **counts)
    base = preference_base(settings) if settings.quality.preference_base_model_path is not None else None
    if dry_run:
        backend = "unsloth" if config.use_unsloth and fast_path_available() else "peft + trl"
        if base is None:
            would = "skip DPO (no MAS_PREFERENCE_BASE_MODEL_PATH)"
            current = None
        else:
            current, _ = _current(settings, actor, base=base)
            would = (
                f"train DPO on {len(train)} pairs with {backend} and judge it on {len(heldout)} held-out "
                f"pairs against {'v' + str(current.version) if current else 'no adapter yet'}"
            )
        reason = f"dry run: would train on {len(train)} pairs (the pairwise taste, then {would}). Nothing was trained."
        return TuneReport(
            taste=None,
            trained=False,
            promoted=False,
            reason=reason,
            current_version=current.version if current else None,
            **counts,
        )
    # one tune at a time: the nightly beat job and a manual `mas tune` may meet
    busy = "another `mas tune` is training right now; wait for it to finish and run it again"
    with locks.held_or_busy(ready_engine(settings), names.TUNE_LOCK, busy=busy):
        taste = tune_taste(settings, actor)
        if base is None:
            reason = (
                "no DPO adapter: MAS_PREFERENCE_BASE_MODEL_PATH names no base model, so the preference axis "
                "stays out of grading and the pairwise taste serves alone."
            )
            return TuneReport(
                taste=taste,
                trained=False,
                promoted=False,
                reason=reason,
                seconds=round(time.monotonic() - started, 2),
                **counts,
            )
        with gpu_turn():
            adapter = _train_and_judge(settings, actor, base=base, train=train, heldout=heldout, config=config)
    return TuneReport(taste=taste, seconds=round(time.monotonic() - started, 2), **adapter, **counts)


def _train_and_judge(
    settings: Settings,
    actor: Actor,
    *,
    base: Path,
    train: Sequence[PreferencePair],
    heldout: Sequence[PreferencePair],
    config: TunerConfig,
) -> dict[str, Any]:
    """Train the next DPO adapter of `actor.user`, judge it and the promoted one on `heldout`, store it."""
    current, lost = _current(settings, actor, base=base)
    version = _next_version(settings)
    folder = (settings.data_dir / "adapters").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    output = folder / f"v{version:04d}-{uuid.uuid4().hex[:8]}"  # never over a folder a wiped database forgot
    metrics = train_adapter(base=base, pairs=train, output=output, config=config)
    accuracy = _heldout_accuracy(base=base, adapter=output, heldout=heldout)
    current_accuracy = None
    if current is not None:  # judged again on today's held-out set, which may have grown since it was trained
        current_accuracy = _heldout_accuracy(base=base, adapter=current.path, heldout=heldout)
    promoted = accuracy >= (config.min_accuracy if current_accuracy is None else current_accuracy)
    with session_scope(settings) as session:
        session.add(
            TrainedAdapter(
                version=version,
                path=str(output),
                base_model=str(base.resolve()),
                pairs_used=len(train),
                heldout_accuracy=accuracy,
                promoted=promoted,
                user_name=actor.user,
                metrics={
                    **metrics,
                    "heldout_pairs": len(heldout),
                    "current_version": current and current.version,
                    "current_accuracy": current_accuracy,
                },
            )
        )
    if current is not None:
        against = f"v{current.version} scores {current_accuracy:.2f}"
    else:
        missing = "the promoted adapter's files are missing" if lost else "no adapter was promoted before"
        against = f"{missing}, so it needed {config.min_accuracy:.2f}"
    verdict = "promoted" if promoted else "kept on file, not promoted"
    reason = f"DPO adapter v{version} {verdict}: held-out accuracy {accuracy:.2f} on {len(heldout)} pairs; {against}."
    return {
        "trained": True,
        "promoted": promoted,
        "reason": reason,
        "version": version,
        "path": str(output),
        "backend": metrics["backend"],
        "heldout_accuracy": accuracy,
        "current_version": current and current.version,
        "current_accuracy": current_accuracy,
    }


def _current(settings: Settings, actor: Actor, *, base: Path) -> tuple[PromotedAdapter | None, bool]:
    """(the promoted adapter, whether its files are lost). Lost files leave nothing to compare with, and
    graders could not load it either, so a lost adapter counts as none."""
    current = promoted_adapter(settings, actor, base=base)
    if current is not None and not current.present:
        return None, True
    return current, False


def _heldout_accuracy(*, base: Path, adapter: Path, heldout: Sequence[PreferencePair]) -> float:
    """Accuracy of the adapter saved at `adapter`, reloaded from disk: what is judged is what will be served."""
    model = PreferenceModel.load(base=base, adapter=adapter)
    if torch.cuda.is_available():
        model.to("cuda")
    try:
        return model.accuracy(heldout)
    finally:
        del model
        _release()


def _next_version(settings: Settings) -> int:
    with session_scope(settings) as session:
        latest = session.execute(sa.select(sa.func.coalesce(sa.func.max(TrainedAdapter.version), 0))).scalar_one()
        return int(latest) + 1
