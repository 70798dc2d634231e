"""The preference model: a small causal LM with one DPO adapter, scoring prompts the way the user chooses.

Shared by the Tuner (`gpu.tuner`), which trains and judges adapters, and the DQA grader (`gpu.dqa`), which
scores with the promoted one: what an adapter is conditioned on, the file saved beside it, how its
implicit reward is computed, and where the promoted adapter is found. Grading needs none of the training.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import torch
from torch import nn

from mas.config import Settings
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.gpu_rules.grading import model_folder
from mas.models import TrainedAdapter

PROMPT_TEMPLATE = "Concept: {concept}\nVideo prompt:"
"""What the preference model is conditioned on; the video prompt follows as the completion."""

METADATA_FILE = "mas_adapter.json"
"""Written beside peft's files: what scoring needs to reproduce training (beta, max_length, template)."""


@dataclass(frozen=True, kw_only=True)
class PreferencePair:
    """One DPO pair: for `concept` the user chose the video made from `chosen` over the one from `rejected`."""

    selection_id: int
    concept: str
    chosen: str
    rejected: str


@dataclass(frozen=True, kw_only=True)
class PromotedAdapter:
    """The adapter graders score with: the newest promoted version for the configured base model."""

    version: int
    path: Path
    heldout_accuracy: float | None

    @property
    def present(self) -> bool:
        """Whether its files are still on disk (a wiped or moved data folder loses them)."""
        return (self.path / METADATA_FILE).is_file()


class PreferenceModel(nn.Module):
    """A base causal LM with one DPO adapter: scores how much the user would like a prompt for a concept.

    An nn.Module so the residency manager can keep it on the GPU between gradings; the base model with the
    adapter disabled is the DPO reference, so one resident model gives both terms of the reward.
    """

    def __init__(self, *, model: Any, tokenizer: Any, beta: float, max_length: int) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.beta = beta
        self.max_length = max_length

    @classmethod
    def load(cls, *, base: Path, adapter: Path) -> PreferenceModel:
        """Load `base` and the adapter saved in `adapter`, on the CPU (the caller places it), in float32: the
        rewards are small differences of summed log-probabilities, which bf16 rounding would swamp."""
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        meta = json.loads((adapter / METADATA_FILE).read_text())
        tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        lm = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=True)
        model = PeftModel.from_pretrained(lm, adapter, is_trainable=False)
        model.eval()
        return cls(model=model, tokenizer=tokenizer, beta=float(meta["beta"]), max_length=int(meta["max_length"]))

    @torch.inference_mode()
    def rewards(self, items: Sequence[tuple[str, str]], *, batch_size: int = 16) -> torch.Tensor:
        """DPO implicit rewards β·(log π − log π_ref) of each (concept, prompt), as a CPU float tensor."""
        out = []
        for start in range(0, len(items), batch_size):
            ids, mask, completion = self._encode(items[start : start + batch_size])
            policy = self._logps(ids, mask, completion)
            with self.model.disable_adapter():
                reference = self._logps(ids, mask, completion)
            out.append((self.beta * (policy - reference)).float().cpu())
        return torch.cat(out) if out else torch.zeros(0)

    def score(self, *, concept: str, prompt: str) -> float:
        """In [0, 1]: σ(reward), the Bradley-Terry probability that the user prefers this prompt over one the
        base model finds exactly as likely (reward 0)."""
        return float(torch.sigmoid(self.rewards([(concept, prompt)]))[0])

    def accuracy(self, pairs: Sequence[PreferencePair]) -> float:
        """Share of pairs whose chosen prompt gets the strictly higher reward (a tie predicts nothing)."""
        if not pairs:
            raise ValueError("no pairs to measure accuracy on")
        chosen = self.rewards([(p.concept, p.chosen) for p in pairs])
        rejected = self.rewards([(p.concept, p.rejected) for p in pairs])
        return float((chosen > rejected).float().mean())

    def _encode(self, items: Sequence[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token ids as trl's DPOTrainer builds them: prompt + " " + completion + EOS, the completion starting
        where the tokenized prompt and prompt + completion diverge, cut at `max_length`."""
        tok = self.tokenizer
        rows = []
        for concept, text in items:
            prompt = PROMPT_TEMPLATE.format(concept=concept)
            prompt_ids = tok(prompt)["input_ids"]
            full = tok(prompt + " " + text + tok.eos_token)["input_ids"][: self.max_length]
            shared = min(len(prompt_ids), len(full))
            start = next((i for i, (a, b) in enumerate(zip(prompt_ids, full)) if a != b), shared)
            rows.append((full, start))
        width = max(len(full) for full, _ in rows)
        device = next(self.model.parameters()).device
        ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        completion = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, (full, start) in enumerate(rows):
            ids[i, : len(full)] = torch.tensor(full)
            mask[i, : len(full)] = 1
            completion[i, start : len(full)] = True
        return ids.to(device), mask.to(device), completion.to(device)

    def _logps(self, ids: torch.Tensor, mask: torch.Tensor, completion: torch.Tensor) -> torch.Tensor:
        """Summed log-probabilities of the completion tokens (trl's `logps` for the sigmoid loss)."""
        logits = self.model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        token_logps = logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        return (token_logps * completion[:, 1:]).sum(-1)


def promoted_adapter(settings: Settings, actor: Actor, *, base: Path) -> PromotedAdapter | None:
    """`actor.user`'s newest promoted adapter trained on `base` (adapters of another base model do not
    apply; a user with none has no preference axis)."""
    with session_scope(settings) as session:
        row = session.execute(
            sa.select(TrainedAdapter)
            .where(
                TrainedAdapter.promoted.is_(True),
                TrainedAdapter.base_model == str(base.resolve()),
                TrainedAdapter.user_name == actor.user,
            )
            .order_by(TrainedAdapter.version.desc())
            .limit(1)
        ).scalar_one_or_none()
        if row is None:
            return None
        return PromotedAdapter(version=row.version, path=Path(row.path), heldout_accuracy=row.heldout_accuracy)


def preference_base(settings: Settings) -> Path:
    """The configured base model folder (MAS_PREFERENCE_BASE_MODEL_PATH), checked; ModelMissing if not."""
    return model_folder(
        settings.quality.preference_base_model_path,
        variable="MAS_PREFERENCE_BASE_MODEL_PATH",
        what="the small causal LM that DPO adapters are trained on",
    )
