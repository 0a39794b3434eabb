# Sourced by test.sh and bench.sh: builds the project (log in $LOGS/build.log, its tail on failure), then
# sets the GPU machine's paths (env.sh) and points the Python suites at the CUDA build's kernels.
LOGS=${OUT:-out}; mkdir -p "$LOGS"
bash deploy/device/build.sh > "$LOGS/build.log" 2>&1 || { tail -60 "$LOGS/build.log"; exit 1; }
source deploy/device/env.sh
export TIGON_KERNELS_LIB=$PWD/$TIGON_BUILD_DIR/kernels/libtigon_kernels.so
