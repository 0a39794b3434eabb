"""The top-level scripts: what the demo builds (only what it runs; scripts/test.sh builds everything), and
the Python they run the client with (Debian's /usr/bin/python3, whatever python3 comes first on PATH)."""
import os
import shutil
import subprocess
import sys

from conftest import ROOT, server_binary

# A python3 like pyenv's or conda's without the client's packages, first on PATH.
PYTHON_WITHOUT_GRPC = """#!/bin/sh
echo "ModuleNotFoundError: No module named 'grpc'" >&2
exit 1
"""


def write_executable(path, text):
    path.write_text(text)
    path.chmod(0o755)


def path_with_python_without_grpc(tmp_path):
    shims = tmp_path / "shims"
    shims.mkdir()
    write_executable(shims / "python3", PYTHON_WITHOUT_GRPC)
    write_executable(shims / "python", PYTHON_WITHOUT_GRPC)
    return f"{shims}:{os.environ['PATH']}"


def script_copy(tmp_path):
    """The repository's scripts in a scratch tree whose setup, cmake, ninja and ctest only record what they
    were asked, and whose tigon.finetune only says that it ran: the scripts' own logic, nothing built."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    for name in ("demo.sh", "build.sh", "test.sh", "finetune.sh"):
        shutil.copy2(os.path.join(ROOT, "scripts", name), tree / "scripts" / name)
    write_executable(tree / "scripts" / "setup.sh", "#!/usr/bin/env bash\nexit 0\n")
    package = tree / "client" / "python" / "tigon"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "finetune.py").write_text("import sys\nprint('finetune ran with', ' '.join(sys.argv[1:]))\n")
    (tree / "build").mkdir()
    (tree / "build" / "build.ninja").write_text("")  # configured already: build.sh goes straight to ninja
    tools = tmp_path / "tools"
    tools.mkdir()
    record = tmp_path / "calls"
    for tool in ("ninja", "cmake", "ctest"):
        write_executable(tools / tool, f'#!/bin/sh\necho "{tool} $*" >> "{record}"\n')
    env = dict(os.environ, PATH=f"{tools}:{path_with_python_without_grpc(tmp_path)}", TIGON_SANITIZERS="0",
               TIGON_FUZZ_SECONDS="0")
    env.pop("TIGON_BUILD_DIR", None)
    env.pop("TIGON_BUILD_TARGETS", None)
    return tree, env, record


def ninja_targets(record):
    """The targets of each ninja call: what follows `-C DIR -j N`."""
    calls = [line.split()[1:] for line in record.read_text().splitlines() if line.startswith("ninja ")]
    targets = []
    for args in calls:
        rest, skip = [], False
        for a in args:
            if skip:
                skip = False
            elif a in ("-C", "-j"):
                skip = True
            else:
                rest.append(a)
        targets.append(rest)
    return targets


def test_demo_builds_only_the_server_and_test_builds_everything(tmp_path):
    tree, env, record = script_copy(tmp_path)
    demo = subprocess.run(["bash", "scripts/demo.sh", "--steps", "3"], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=120)
    assert demo.returncode == 0, demo.stderr
    assert "finetune ran with --server-bin build/server/tigon-server" in demo.stdout and "--steps 3" in demo.stdout
    # The server links the engine and kernel libraries, so ninja builds them with it; no test suite.
    assert ninja_targets(record) == [["tigon-server"]]

    record.unlink()
    test = subprocess.run(["bash", "scripts/test.sh"], cwd=tree, env=dict(env, TIGON_BUILD_TARGETS="tigon-server"),
                          capture_output=True, text=True, timeout=120)
    assert test.returncode == 0, test.stderr
    assert ninja_targets(record) == [[]]  # no target: everything, the test suites included
    assert any(line.startswith("ctest ") for line in record.read_text().splitlines())


def test_finetune_script_runs_with_a_python_without_grpc_first_on_path(tmp_path):
    env = dict(os.environ, PATH=path_with_python_without_grpc(tmp_path))
    env.pop("PYTHONPATH", None)
    assert subprocess.run(["python3", "-c", "pass"], env=env, capture_output=True).returncode != 0
    script = os.path.join(ROOT, "scripts", "finetune.sh")
    out = subprocess.run([script, "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--server-bin" in out.stdout
    out = subprocess.run([script, "--server-bin", server_binary(), "--kernels", "fused", "--steps", "3",
                          "--batch-size", "2", "--seq-len", "16", "--hidden", "32"],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "summary" in out.stdout


def test_importing_the_client_without_grpc_names_the_python_to_use():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    out = subprocess.run([sys.executable, "-c", "import sys; sys.modules['grpc'] = None; import tigon"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "/usr/bin/python3" in out.stderr and "python3-grpcio" in out.stderr and sys.executable in out.stderr
