# Sourced by the device scripts: unpacks the carried .deb packages (never into /) and sets the paths the
# build needs on the GPU machine (Ubuntu 24.04, LibTorch 2.11 + CUDA 13 under /opt/torch/.venv).
DEPS=/opt/deps
[[ -d .deps/debs ]] || { echo "no .deps/debs: run deploy/device/fetch-deps.sh and carry .deps" >&2; exit 1; }
mkdir -p $DEPS/.unpacked
for f in .deps/debs/*.deb; do
  stamp=$DEPS/.unpacked/$(basename "$f")
  [[ -e $stamp ]] || { dpkg -x "$f" $DEPS && touch "$stamp"; }
done
export LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$DEPS/usr/bin:/opt/torch/.venv/bin:$PATH
export TIGON_PYTHON=/opt/torch/.venv/bin/python3
TORCH_CMAKE=$($TIGON_PYTHON -c "import torch; print(torch.utils.cmake_prefix_path)")
export TORCH_CMAKE
[[ -d .deps/data ]] && export TIGON_DATA_DIR=$PWD/.deps/data
export TIGON_BUILD_DIR=${TIGON_BUILD_DIR:-build-gpu}
[[ -d .deps/python ]] && export PYTHONPATH=$PWD/.deps/python${PYTHONPATH:+:$PYTHONPATH}
