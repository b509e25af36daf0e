// ExecuTorch's runtime, seen through plain types: the half of the native delegate
// calls compiled against ExecuTorch's headers (whose c10 copy cannot meet torch's in
// one translation unit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ptexec_native {

// The start of each cache line of the `bytes` at `p`, appended to `out` (which holds
// `n` of at most `capacity`): addresses to prefetch. Returns the new count.
inline size_t cache_lines(const void* p, size_t bytes, const void** out, size_t n,
                          size_t capacity) {
  for (size_t at = 0; at < bytes && n < capacity; at += 64) {
    out[n++] = static_cast<const char*>(p) + at;
  }
  return n;
}

// One tensor handed to ExecuTorch: its memory, laid out densely in `dim_order`.
struct Arg {
  void* data;
  int64_t ndim;
  const int64_t* sizes;
  const int64_t* dim_order;
  int dtype;  // c10::ScalarType's number (ExecuTorch numbers its types the same)
};

// Where a one-delegate program's delegate lies in its bytes, and what it is given at
// its init: its payload (offset and size), its compile specs, and per tensor (the
// delegate call's arguments, the program's inputs) whether its shape is static.
struct Spec {
  const char* key;
  const void* value;
  size_t size;
};
struct Delegate {
  size_t payload_offset;
  size_t payload_size;
  const Spec* specs;
  size_t nspecs;
  const uint8_t* fixed;
  size_t ntensors;
};

// Loads the one-delegate program `data` (read in place: it must outlive the result) and
// initializes its delegate with ExecuTorch's backend of it, to be called directly (no
// ExecuTorch Method); nullptr with `error` set when ExecuTorch refuses it.
void* et_load(const void* data, size_t size, const Delegate& delegate, std::string* error);
void et_free(void* method);
// Hands `args` over as the delegate's arguments and executes it; nonzero with `error`
// set on failure. A delegate initialized with a thread pool that is no longer
// ExecuTorch's is initialized again first (XNNPACK's runtime keeps the pool it was made
// with), and so is one whose last execute failed (which destroys it).
int et_run(void* method, size_t n, const Arg* args, std::string* error);
// The sizes argument `i` has after a call (what the delegate resized a dynamic output
// to); its rank, or -1 when it exceeds `capacity`.
int64_t et_sizes(void* method, size_t i, int64_t* sizes, int64_t capacity);
// Up to `capacity` addresses a call of `method` reads first (its record, its arguments'
// records and values, the delegate's handle), for a caller to prefetch; their count.
// They hold until the delegate is initialized again (a stale one is only a wasted
// prefetch).
size_t et_hot(void* method, const void** out, size_t capacity);
// How many times the delegate has been initialized (1, and one more for each init
// after a change of thread pool): the addresses `et_hot` gave hold while this holds.
uint64_t et_loads(void* method);

}  // namespace ptexec_native
