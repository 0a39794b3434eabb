// The CUDA caching allocator's defaults for a process that loads the engine, set when the library is
// loaded (before any CUDA allocation reads them): expandable segments, so that blocks freed by one step's
// activations are remapped for the next step's differently sized ones instead of fragmenting reserved
// memory; this is what lets the longest sequences fit. A PYTORCH_CUDA_ALLOC_CONF set by the user wins.
#include <cstdlib>

namespace tigon::engine {
namespace {

struct CudaAllocatorDefaults {
  CudaAllocatorDefaults() { ::setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", /*overwrite=*/0); }
};
const CudaAllocatorDefaults kCudaAllocatorDefaults;

}  // namespace
}  // namespace tigon::engine
