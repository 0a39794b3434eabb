"""CreateSession's model_path through the real server: only folders inside a --model-root (and the
caller's checkpoints) are offered; every other folder, existing or not, gets one message that names no
path; symbolic links out of the root are refused; a config.json is size-capped before it is read and
its fields are not echoed."""
import os
import shutil

import pytest

import tigon
from conftest import ROOT, process_memory_bytes

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "llama")


@pytest.fixture
def layout(tmp_path):
    """models/ (the model root, with llama/ a copy of the fixture) beside outside/ (not a root)."""
    models, outside = tmp_path / "models", tmp_path / "outside"
    shutil.copytree(FIXTURE, models / "llama")
    shutil.copytree(FIXTURE, outside / "llama")
    (outside / "empty").mkdir()
    return models, outside


def refusal(client, model_path, error=tigon.NotFound):
    with pytest.raises(error) as info:
        client.create_session(model_path, precision="fp32").close()
    return info.value.message


def test_only_folders_inside_the_model_root_are_offered_and_refusals_are_alike(start_server, layout, tmp_path):
    models, outside = layout
    server = start_server(f"--model-root={models}")
    client = server.client()
    for name in ("llama", str(models / "llama"), str(models / "llama") + "/"):
        with client.create_session(name, precision="fp32") as session:
            assert session.info_at_creation.model_family == "llama"
    messages = {
        "an existing model folder outside the root": refusal(client, str(outside / "llama")),
        "a folder that does not exist": refusal(client, "/nonexistent/tigon/model"),
        "an existing folder without config.json": refusal(client, str(outside / "empty")),
        "a name that does not exist in the root": refusal(client, "absent"),
        "a relative path out of the root": refusal(client, "../outside/llama"),
        "the root's parent": refusal(client, str(tmp_path)),
        "a system folder": refusal(client, "/etc"),
    }
    assert len(set(messages.values())) == 1, messages
    message = messages["a folder that does not exist"]
    assert str(tmp_path) not in message and "does not exist" not in message and "has no" not in message
    assert "--model-root" in message
    assert client.server_info().active_sessions == 0


def test_symbolic_links_out_of_the_root_are_refused(start_server, layout):
    models, outside = layout
    secret = outside / "secret.bin"
    secret.write_bytes(b"not yours " * 1000)
    # A folder link out of the root, a weight file linked out, and a shard of an index linked out.
    (models / "linked").symlink_to(outside / "llama", target_is_directory=True)
    shutil.copytree(FIXTURE, models / "weights-out")
    os.remove(models / "weights-out" / "model.safetensors")
    (models / "weights-out" / "model.safetensors").symlink_to(outside / "llama" / "model.safetensors")
    (models / "shard-out").mkdir()
    shutil.copy(FIXTURE + "/config.json", models / "shard-out" / "config.json")
    (models / "shard-out" / "model.safetensors.index.json").write_text(
        '{"weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}')
    (models / "shard-out" / "model-00001-of-00001.safetensors").symlink_to(secret)
    # A link that stays inside the root (the Hugging Face cache's snapshots -> blobs layout) is fine.
    (models / "blobs").mkdir()
    shutil.copy(FIXTURE + "/model.safetensors", models / "blobs" / "weights")
    (models / "cached").mkdir()
    shutil.copy(FIXTURE + "/config.json", models / "cached" / "config.json")
    (models / "cached" / "model.safetensors").symlink_to(models / "blobs" / "weights")

    server = start_server(f"--model-root={models}")
    client = server.client()
    not_offered = refusal(client, "/nonexistent/tigon/model")
    assert refusal(client, "linked") == not_offered
    assert refusal(client, str(models / "linked")) == not_offered
    for name in ("weights-out", "shard-out"):
        message = refusal(client, name, tigon.PermissionDenied)
        assert "symbolic link out of it" in message
        assert str(outside) not in message and "secret" not in message and "10000" not in message
    with client.create_session("cached", precision="fp32") as session:
        assert session.info_at_creation.model_family == "llama"


def test_config_fields_are_not_echoed_and_engine_errors_name_no_server_path(start_server, layout):
    models, _ = layout
    shutil.copytree(FIXTURE, models / "secret")
    (models / "secret" / "config.json").write_text('{"model_type": "SECRET-7f3a9c"}')
    shutil.copytree(FIXTURE, models / "broken")
    (models / "broken" / "model.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{}")
    client = start_server(f"--model-root={models}").client()
    message = refusal(client, "secret", tigon.InvalidArgument)
    assert "SECRET" not in message and "model_type" in message and "llama" in message
    with pytest.raises(tigon.TigonError) as info:
        client.create_session("broken", precision="fp32")
    assert str(models) not in info.value.message and "model.safetensors" in info.value.message




def test_an_oversized_sparse_config_is_refused_without_reading_it(start_server, layout):
    models, _ = layout
    (models / "huge").mkdir()
    shutil.copy(FIXTURE + "/model.safetensors", models / "huge" / "model.safetensors")
    with open(models / "huge" / "config.json", "wb") as f:
        f.write(b'{"model_type": "llama", "pad": "')
        f.truncate(256 << 20)  # 256 MiB, almost all of it a hole
    server = start_server(f"--model-root={models}")
    client = server.client()
    before = process_memory_bytes(server.proc.pid, "VmHWM")
    message = refusal(client, "huge", tigon.FailedPrecondition)
    assert "config.json is larger than" in message and "not read" in message
    assert process_memory_bytes(server.proc.pid, "VmHWM") - before < (64 << 20), "the server read the file"


def test_without_a_model_root_model_path_reaches_only_the_callers_checkpoints(start_server, layout, tmp_path):
    models, _ = layout
    checkpoints = tmp_path / "checkpoints"
    client = start_server(f"--checkpoint-root={checkpoints}").client()
    not_offered = refusal(client, str(models / "llama"))
    assert "--model-root" in not_offered and str(models) not in not_offered
    with client.create_session({"model_type": "llama", "vocab_size": 64, "hidden_size": 16,
                                "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2},
                               precision="fp32") as session:
        session.train_step([[1, 2, 3, 4]])
        session.save("mine")
    for name in ("mine", str(checkpoints / "mine")):
        with client.create_session(name, precision="fp32") as reloaded:
            assert reloaded.info_at_creation.vocab_size == 64
    bare = start_server(name="bare").client()
    message = refusal(bare, str(models / "llama"), tigon.FailedPrecondition)
    assert "--model-root" in message and "config_json" in message


def test_deeply_nested_json_in_a_model_folder_is_refused_and_the_server_lives(start_server, layout):
    """config.json and model.safetensors.index.json are parsed with a depth bound: 100,000 levels of
    nesting once overflowed the stack in a recursive copy, ending the server and every session in it."""
    import json
    models, _ = layout
    deep = "[" * 100_000 + "]" * 100_000
    shutil.copytree(models / "llama", models / "deep_config")
    config = json.loads((models / "llama" / "config.json").read_text())
    (models / "deep_config" / "config.json").write_text(json.dumps(config)[:-1] + ', "x": ' + deep + "}")
    shutil.copytree(models / "llama", models / "deep_index")
    (models / "deep_index" / "model.safetensors").unlink()
    (models / "deep_index" / "model.safetensors.index.json").write_text('{"weight_map": ' + deep + "}")
    server = start_server(f"--model-root={models}")
    client = server.client()
    with client.create_session("llama", precision="fp32") as bystander:
        for name in ("deep_config", "deep_index"):
            with pytest.raises((tigon.InvalidArgument, tigon.FailedPrecondition)) as info:
                client.create_session(name, precision="fp32").close()
            assert "index" in info.value.message or "config.json" in info.value.message, info.value.message
        assert bystander.info().model_family == "llama", "the server and its sessions outlived the requests"
    assert server.proc.poll() is None


def test_a_session_from_a_model_folder_saves_complete_folders_and_no_file_linked_out(start_server, layout, tmp_path):
    models, outside = layout
    (models / "llama" / "tokenizer.json").write_text('{"version": "1.0"}')
    (models / "llama" / "generation_config.json").write_text('{"eos_token_id": 2}')
    # A tokenizer linked out of the root would be copied into a checkpoint: refused like a weight file.
    shutil.copytree(FIXTURE, models / "tokenizer-out")
    (outside / "secret.txt").write_text("not yours")
    (models / "tokenizer-out" / "tokenizer.json").symlink_to(outside / "secret.txt")
    checkpoints = tmp_path / "checkpoints"
    server = start_server(f"--model-root={models}", f"--checkpoint-root={checkpoints}")
    client = server.client()
    message = refusal(client, "tokenizer-out", tigon.PermissionDenied)
    assert "tokenizer.json" in message and "symbolic link out of it" in message and str(outside) not in message
    with client.create_session("llama", precision="fp32") as session:
        session.train_step([[1, 2, 3, 4]])
        session.save("export")
    saved = set(os.listdir(checkpoints / "export"))
    assert {"config.json", "model.safetensors", "tigon_state.json", "tokenizer.json", "generation_config.json"} <= saved
    assert (checkpoints / "export" / "tokenizer.json").read_text() == '{"version": "1.0"}'
