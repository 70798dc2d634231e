"""Which export of the embedding model a process uses: one per model folder's contents."""

from mas.memory.embedding_export import _key


def test_a_changed_model_folder_is_exported_again(tmp_path):
    (tmp_path / "modules.json").write_text("[]")
    (tmp_path / "config.json").write_text('{"hidden_size": 384}')
    first = _key(tmp_path)
    assert _key(tmp_path) == first
    (tmp_path / "config.json").write_text('{"hidden_size": 1024}')  # another size: seen even where times are coarse
    assert _key(tmp_path) != first
