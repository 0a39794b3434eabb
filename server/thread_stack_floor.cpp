// Debian's civetweb (the metrics exposer's HTTP server) starts its threads with 100 KiB stacks. glibc
// places a thread's static TLS at the top of its stack, and with the CUDA LibTorch loaded at start-up
// (through libtigon_engine.so) that TLS no longer fits: pthread_create fails and the exposer cannot start
// ("Cannot create threads"). The server's own pthread_attr_setstacksize, which the dynamic linker binds
// civetweb's calls to, raises any smaller request to glibc's default of 8 MiB (address space, not memory
// in use) and forwards it to the C library's.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

namespace {
constexpr std::size_t kMinimumThreadStackBytes = std::size_t{8} << 20;
using SetStackSize = int (*)(pthread_attr_t*, std::size_t);
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, std::size_t stack_size) {
  static const SetStackSize next = reinterpret_cast<SetStackSize>(::dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (next == nullptr) return 0;  // keep the default stack, which is large enough
  return next(attr, stack_size < kMinimumThreadStackBytes ? kMinimumThreadStackBytes : stack_size);
}
