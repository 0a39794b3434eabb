# Helpers for the targets that compile against LibTorch: a precompiled header (torch's headers cost about
# 30 s per translation unit on two cores) and the CUDA switch.
set(TIGON_TORCH_PCH_HEADERS <torch/torch.h>)

function(tigon_torch_target target)
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  target_precompile_headers(${target} PRIVATE ${TIGON_TORCH_PCH_HEADERS})
  if(TIGON_TORCH_CUDA)
    target_compile_definitions(${target} PUBLIC TIGON_WITH_CUDA=1)
  endif()
endfunction()
