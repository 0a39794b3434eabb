"""The torch/no-torch split (docs/ARCHITECTURE.md): no server translation unit includes torch, models/
or kernels/ headers or sees torch's include directories."""
import glob
import json
import os
import re

from conftest import ROOT, server_binary


def includes_of(*patterns):
    """(path, header) for every #include of the files matching the globs under ROOT; asserts there are files."""
    paths = [p for pattern in patterns for p in glob.glob(os.path.join(ROOT, pattern))]
    assert paths, patterns
    for path in paths:
        with open(path) as f:
            for header in re.findall(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', f.read(), re.M):
                yield path, header


def test_server_sources_include_only_the_engine_contract():
    for path, header in includes_of("server/*.cpp", "server/*.h"):
        assert not re.match(r"(torch|ATen|c10|caffe2|models|kernels|engine/src)/", header), (path, header)


def test_server_compile_lines_have_no_torch_include_directories():
    build_dir = os.path.dirname(os.path.dirname(server_binary()))
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        commands = json.load(f)
    server_units = [c for c in commands if os.path.relpath(c["file"], ROOT).startswith(("server", "tests/server"))
                    or "/server/gen/" in c["file"]]
    assert len(server_units) >= 10
    # The check itself catches torch: an engine unit has torch's include directory and its PCH.
    engine = next(c for c in commands if c["file"].endswith("engine/src/session/session.cpp"))
    engine_line = engine.get("command") or " ".join(engine["arguments"])
    assert re.search(r"(-I|-isystem\s*)\S*torch", engine_line)
    for unit in server_units:
        line = unit.get("command") or " ".join(unit["arguments"])
        assert not re.search(r"(-I|-isystem\s*)\S*(torch|ATen)", line), unit["file"]
        # The engine's test hooks (engine/src/testing) are for tests, not for the service.
        assert "engine/src/testing" not in line, unit["file"]
        assert "-include" not in line.split(), f"{unit['file']} uses a precompiled (torch) header"


def test_cuda_kernels_include_only_cuda_and_cxx_headers():
    """kernels/cuda is the lowest layer: nvcc compiles it without torch, so it includes its own headers and
    system (C++, CUDA) headers only, never the ops, the references, models, the engine or torch."""
    for path, header in includes_of("kernels/cuda/*"):
        assert not re.match(r"(torch|ATen|c10|caffe2|models|engine|server)/", header), (path, header)
        assert not header.startswith("kernels/") or header.startswith("kernels/cuda/"), (path, header)


def test_common_headers_include_only_the_standard_library_and_nlohmann():
    """common/ is shared by the server, the engine and the models: it may not reach into any of them (nor
    torch), or the server would compile against torch through it."""
    for path, header in includes_of("common/*"):
        assert "/" not in header or header.startswith("nlohmann/"), (path, header)
