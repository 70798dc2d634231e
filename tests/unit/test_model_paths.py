"""A model folder that is unset or not a model is a clear error naming the setting, before anything loads. No
server, no model."""

from __future__ import annotations

import pytest

from gpu.diffusers_backend import ModelPathError
from gpu.dqa import DQAGrader
from gpu.factory import video_backend
from gpu.preference_model import preference_base
from gpu.residency import Residency
from mas.config import Settings
from mas.gpu_rules.grading import ModelMissing


def cpu_residency() -> Residency:
    return Residency(budget_bytes=None, device="cpu")


def test_a_missing_model_folder_says_what_to_set(tmp_path):
    with pytest.raises(ModelPathError, match="set MAS_DIFFUSERS_MODEL_PATH to a local LTX-2 diffusers folder"):
        video_backend(Settings(data_dir=tmp_path, video_backend="diffusers"))
    with pytest.raises(ModelPathError, match="no model_index.json"):  # noqa: RUF043
        video_backend(Settings(data_dir=tmp_path, video_backend="diffusers", diffusers_model_path=tmp_path))


def test_a_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelMissing, match="MAS_CLIP_MODEL_PATH is unset"):
        DQAGrader(settings=Settings(clip_model_path=None), residency=cpu_residency())
    with pytest.raises(ModelMissing, match="no config.json"):  # noqa: RUF043
        DQAGrader(settings=Settings(clip_model_path=tmp_path), residency=cpu_residency())
    with pytest.raises(ModelMissing, match="MAS_PREFERENCE_BASE_MODEL_PATH"):
        preference_base(Settings(preference_base_model_path=tmp_path / "nowhere"))
