// Owns the torch.ops.tigon namespace; each op file adds its schema with TORCH_LIBRARY_FRAGMENT.
#include <torch/library.h>

TORCH_LIBRARY(tigon, m) {}
