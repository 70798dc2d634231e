"""The Tuner, run for real: trl's DPOTrainer with a peft LoRA adapter on a tiny Llama built here, fed with
A/B choices stored in the real PostgreSQL, judged on held-out choices and promoted (or not).

The simulated user has a hidden taste: a linear utility over the words of a prompt (close-ups and purple
good, handheld shots and orange bad). Given two variations of a concept, it picks the one it likes more.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import sqlalchemy as sa

from gpu.dqa import DQAGrader
from gpu.preference_model import METADATA_FILE, PROMPT_TEMPLATE, PreferenceModel, PreferencePair, promoted_adapter
from gpu.residency import Residency
from gpu.tuner import TunerConfig, load_pairs, tune
from mas.db import session_scope
from mas.domain.identity import STUDIO
from mas.models import ABSelection, ABTest, TasteModel, TrainedAdapter
from tests.integration.test_dqa import build_tiny_clip, concept_video, train_tokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("peft")

SHOTS = ("close-up portrait", "wide establishing shot", "aerial drone sweep", "handheld tracking shot")
COLOURS = ("purple", "teal", "orange", "gold")
MOODS = ("moody", "serene", "cheerful", "gritty")
CONCEPTS = ("a dragon", "a phoenix", "a kraken", "a griffin", "a unicorn", "a golem", "a wyvern", "a sphinx")
TASTE = {"close-up": 1.0, "purple": 0.8, "moody": 0.5, "teal": 0.3, "handheld": -1.0, "orange": -0.8, "cheerful": -0.5}
"""The hidden taste: what each word is worth to the simulated user (unlisted words are worth nothing)."""

TINY = TunerConfig(
    learning_rate=5e-3, epochs=8, batch_size=8, max_length=64, lora_r=8, lora_alpha=16, lora_dropout=0.0,
    gradient_checkpointing=False, heldout_every=4,
)
"""Settings that make a tiny random Llama learn a taste in seconds on a CPU."""


@dataclass(frozen=True)
class SimulatedUser:
    taste: dict[str, float]

    def utility(self, prompt: str) -> float:
        return sum(self.taste.get(word, 0.0) for word in prompt.replace(",", " ").split())

    def choose(self, a: str, b: str) -> tuple[str, str]:
        """(chosen, rejected)."""
        return (a, b) if self.utility(a) > self.utility(b) else (b, a)


def variation(rng: random.Random, concept: str) -> str:
    return f"{concept}, {rng.choice(SHOTS)}, {rng.choice(COLOURS)} palette, {rng.choice(MOODS)} atmosphere"


def choices(user: SimulatedUser, *, count: int, seed: int, concepts=CONCEPTS) -> list[PreferencePair]:
    """`count` A/B choices between two variations the user does not like equally."""
    rng, out = random.Random(seed), []
    while len(out) < count:
        concept = rng.choice(concepts)
        a, b = variation(rng, concept), variation(rng, concept)
        if user.utility(a) != user.utility(b):
            chosen, rejected = user.choose(a, b)
            out.append(PreferencePair(selection_id=len(out), concept=concept, chosen=chosen, rejected=rejected))
    return out


def vocabulary() -> list[str]:
    return [PROMPT_TEMPLATE.format(concept=c) for c in CONCEPTS] + [
        f"{s}, {c} palette, {m} atmosphere" for s in SHOTS for c in COLOURS for m in MOODS
    ]


def build_tiny_lm(folder: Path, *, texts: list[str]) -> Path:
    """A tiny random Llama (hidden size 64) with a word-level tokenizer trained on `texts`."""
    import torch

    tokenizer = train_tokenizer(texts, wrap=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    ))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def record(settings, pairs: list[PreferencePair]) -> None:
    """Store choices as `mas pick` does: a closed A/B test and a selection row each."""
    with session_scope(settings) as session:
        for pair in pairs:
            test = ABTest(concept=pair.concept, status="closed", winner_label="A")
            session.add(test)
            session.flush()
            session.add(ABSelection(test_id=test.id, chosen_label="A", chosen_prompt=pair.chosen,
                                    rejected_prompts=[pair.rejected], concept=pair.concept))


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-llama"), texts=vocabulary())


@pytest.fixture
def tuner_settings(clean, lm_folder):
    return clean.model_copy(update={"preference_base_model_path": lm_folder, "min_preference_pairs": 8})


USER = SimulatedUser(TASTE)


def test_too_few_pairs_trains_nothing(tuner_settings):
    record(tuner_settings, choices(USER, count=5, seed=1))
    for dry_run in (False, True):
        report = tune(tuner_settings, STUDIO, dry_run=dry_run, config=TINY)
        assert not report.trained and not report.promoted
        assert (report.pairs, report.needed_pairs) == (5, 8)
        assert "5 preference pairs" in report.reason and "8 needed" in report.reason
        assert "Nothing was trained" in report.reason
    with session_scope(tuner_settings) as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(TrainedAdapter)) == 0


def test_with_no_base_model_the_tune_fits_the_taste_and_never_takes_the_gpu(clean):
    settings = clean.model_copy(update={"min_preference_pairs": 8})
    record(settings, choices(USER, count=12, seed=4))
    report = tune(settings, STUDIO, gpu_turn=lambda: pytest.fail("took the GPU"))
    assert report.taste is not None and report.taste.trained and not report.trained
    assert "MAS_PREFERENCE_BASE_MODEL_PATH names no base model" in report.reason


def test_dry_run_says_what_it_would_do(tuner_settings):
    record(tuner_settings, choices(USER, count=12, seed=2))
    report = tune(tuner_settings, STUDIO, dry_run=True, config=TINY)
    assert not report.trained and (report.train_pairs, report.heldout_pairs) == (9, 3)
    assert report.reason.startswith("dry run: would train on 9 pairs") and "peft + trl" in report.reason
    with session_scope(tuner_settings) as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(TrainedAdapter)) == 0




def test_dpo_learns_the_taste_is_promoted_serves_grading_and_a_worse_adapter_is_not_promoted(
    tuner_settings, lm_folder, tmp_path
):
    record(tuner_settings, choices(USER, count=32, seed=3))
    assert len(load_pairs(tuner_settings, STUDIO)) == 32

    turns = []

    @contextmanager
    def gpu_turn():  # records when the GPU would be taken: after the taste (CPU) was fitted and stored
        with session_scope(tuner_settings) as session:
            turns.append(session.scalar(sa.select(sa.func.count()).select_from(TasteModel)))
        yield

    first = tune(tuner_settings, STUDIO, config=TINY, gpu_turn=gpu_turn)
    assert turns == [1]  # one GPU turn, for DPO only
    assert first.trained and first.promoted and first.version == 1 and first.backend == "peft"
    assert (first.train_pairs, first.heldout_pairs) == (24, 8)
    assert first.heldout_accuracy >= 0.75 and first.current_version is None
    adapter = Path(first.path)
    assert (adapter / "adapter_config.json").is_file() and (adapter / METADATA_FILE).is_file()

    # reloaded from disk, the adapter predicts fresh choices of new concepts well above chance
    unseen = choices(USER, count=60, seed=99, concepts=("a hydra", "a centaur", "a basilisk"))
    reloaded = PreferenceModel.load(base=lm_folder, adapter=adapter)
    assert reloaded.accuracy(unseen) >= 0.7
    promoted = promoted_adapter(tuner_settings, STUDIO, base=lm_folder)
    assert promoted is not None and promoted.version == 1 and promoted.path == adapter

    # the DQA preference axis now comes from the promoted adapter, resident beside CLIP
    clip = build_tiny_clip(tmp_path / "clip", steps=0)
    graded = tuner_settings.model_copy(update={"clip_model_path": clip, "torch_dtype": "float32", "dqa_frames": 3})
    residency = Residency(budget_bytes=None, device="cpu")
    grader = DQAGrader(settings=graded, residency=residency)
    video = concept_video(tmp_path / "dragon.mp4", "red circle", frames=4)
    liked, _ = grader(actor=STUDIO, video=video, concept="a dragon",
                      prompt="a dragon, close-up portrait, purple palette, moody atmosphere")
    disliked, _ = grader(actor=STUDIO, video=video, concept="a dragon",
                         prompt="a dragon, handheld tracking shot, orange palette, cheerful atmosphere")
    assert liked["preference"] > disliked["preference"] and liked["total"] > disliked["total"]
    assert residency.stats().loads == 2  # CLIP and the preference model, each loaded once for both videos

    # an adapter that learned nothing (learning rate 1e-9) is recorded but not promoted
    worse = tune(tuner_settings, STUDIO, config=replace(TINY, learning_rate=1e-9, epochs=1))
    assert worse.trained and not worse.promoted and worse.version == 2
    assert worse.current_version == 1 and worse.heldout_accuracy < worse.current_accuracy
    assert "not promoted" in worse.reason
    assert promoted_adapter(tuner_settings, STUDIO, base=lm_folder).version == 1
    with session_scope(tuner_settings) as session:
        rows = session.execute(sa.select(TrainedAdapter.version, TrainedAdapter.promoted, TrainedAdapter.pairs_used)
                               .order_by(TrainedAdapter.version)).all()
    assert [tuple(r) for r in rows] == [(1, True, 24), (2, False, 24)]
