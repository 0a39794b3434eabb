#include "kernels/ops/cuda_glue.h"

#include <string>

#ifdef TIGON_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif
#ifdef TIGON_CUDA_KERNELS
#include <cuda_runtime_api.h>
#endif

namespace tigon::ops {

void* CurrentCudaStream(const torch::Device& device) {
#ifdef TIGON_WITH_CUDA
  return static_cast<void*>(c10::cuda::getCurrentCUDAStream(device.index()).stream());
#else
  (void)device;
  TORCH_CHECK(false, "tigon: this build's LibTorch has no CUDA support");
#endif
}

cuda::DType CudaDType(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat: return cuda::DType::kFloat32;
    case torch::kBFloat16: return cuda::DType::kBFloat16;
    case torch::kHalf: return cuda::DType::kFloat16;
    default: TORCH_CHECK(false, "tigon: CUDA kernels take float32, bfloat16 or float16, got ", t.scalar_type());
  }
}

void CheckLaunch(cuda::LaunchStatus status, const char* what) {
#ifdef TIGON_CUDA_KERNELS
  TORCH_CHECK(status == 0, "tigon: ", what, " failed: ", cudaGetErrorString(static_cast<cudaError_t>(status)));
#else
  TORCH_CHECK(status == 0, "tigon: ", what, " failed with CUDA error ", status);
#endif
}

}  // namespace tigon::ops
