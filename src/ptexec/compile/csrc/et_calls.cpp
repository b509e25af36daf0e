// The ExecuTorch half of the native delegate calls (et_calls.h).
#include "et_calls.h"

#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/util/tensor_dimension_limit.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

struct pthreadpool;
namespace executorch::extension::threadpool {
pthreadpool* get_pthreadpool();
}
extern "C" size_t pthreadpool_get_threads_count(pthreadpool* pool);

namespace et = executorch::runtime;
namespace ea = executorch::aten;

namespace ptexec_native {
namespace {

// the most dims a tensor ExecuTorch takes may have
constexpr int64_t kMaxDims = static_cast<int64_t>(et::kTensorDimensionLimit);

// One input of the method: what was handed over last (its memory, dtype and sizes;
// `held` false: nothing, or a call failed) and its geometry as ExecuTorch reads it,
// kept across calls.
struct Held {
  void* data = nullptr;
  int dtype = -1;
  bool held = false;
  bool shared = false;  // not planned: ExecuTorch shares its memory
  int64_t ndim = 0;
  ea::SizesType sizes[kMaxDims] = {};
  ea::DimOrderType order[kMaxDims] = {};
  ea::StridesType strides[kMaxDims] = {};
};

struct Loaded {
  // what every call reads first, together at the front
  pthreadpool* pool = nullptr;  // the pool the method's XNNPACK runtime was made with
  size_t threads = 0;
  size_t inputs = 0;  // the method's input count
  uint64_t loads = 0;  // how many times the method was loaded
  // per input, one record each, side by side: what a call compares is read from one
  // place (between two calls XNNPACK's work has pushed it out of the cache)
  std::vector<Held> held;
  executorch::extension::BufferDataLoader loader;
  std::optional<et::Program> program;
  executorch::extension::MallocMemoryAllocator method_allocator;
  executorch::extension::MallocMemoryAllocator temp_allocator;
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<et::Span<uint8_t>> spans;
  std::optional<et::HierarchicalAllocator> planned;
  std::optional<et::MemoryManager> memory;
  std::optional<et::Method> method;

  Loaded(const void* data, size_t size) : loader(data, size) {}
};

std::string code(et::Error e) { return std::to_string(static_cast<int>(e)); }

bool load_method(Loaded* m, std::string* error) {
  ++m->loads;
  m->method.reset();
  m->memory.reset();
  m->planned.reset();
  m->spans.clear();
  m->buffers.clear();
  m->method_allocator.reset();
  auto meta = m->program->method_meta("forward");
  if (!meta.ok()) {
    *error = "the program has no method 'forward' (error " + code(meta.error()) + ")";
    return false;
  }
  for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
    auto size = meta->memory_planned_buffer_size(i);
    if (!size.ok()) {
      *error = "planned buffer " + std::to_string(i) + " has no size";
      return false;
    }
    m->buffers.emplace_back(static_cast<size_t>(size.get()));
  }
  for (auto& b : m->buffers) m->spans.emplace_back(b.data(), b.size());
  m->planned.emplace(et::Span<et::Span<uint8_t>>(m->spans.data(), m->spans.size()));
  m->memory.emplace(&m->method_allocator, &*m->planned, &m->temp_allocator);
  m->pool = executorch::extension::threadpool::get_pthreadpool();
  m->threads = m->pool != nullptr ? pthreadpool_get_threads_count(m->pool) : 0;
  auto method = m->program->load_method("forward", &*m->memory);
  if (!method.ok()) {
    *error = "ExecuTorch could not load the method (error " + code(method.error()) + ")";
    return false;
  }
  m->method.emplace(std::move(method.get()));
  size_t n = m->method->inputs_size();
  m->inputs = n;
  m->held.assign(n, Held{});
  for (size_t i = 0; i < n; ++i) {
    auto info = meta->input_tensor_meta(i);
    m->held[i].shared = info.ok() && !info->is_memory_planned();
  }
  return true;
}

}  // namespace

void* et_load(const void* data, size_t size, std::string* error) {
  et::runtime_init();
  auto m = std::make_unique<Loaded>(data, size);
  auto program = et::Program::load(&m->loader, et::Program::Verification::InternalConsistency);
  if (!program.ok()) {
    *error = "ExecuTorch could not load the program (error " + code(program.error()) + ")";
    return nullptr;
  }
  m->program.emplace(std::move(program.get()));
  if (!load_method(m.get(), error)) return nullptr;
  return m.release();
}

void et_free(void* method) { delete static_cast<Loaded*>(method); }

size_t et_inputs(void* method) { return static_cast<Loaded*>(method)->inputs; }

namespace {

// whether the input was handed over last with this dtype and sizes (its dim order is the
// call's own, the same every call)
bool shaped_as_held(const Held& h, const Arg& a) {
  if (!h.held || h.dtype != a.dtype || h.ndim != a.ndim) return false;
  for (int64_t d = 0; d < a.ndim; ++d) {
    if (h.sizes[d] != a.sizes[d]) return false;
  }
  return true;
}

}  // namespace

int et_run(void* method, size_t n, const Arg* args, std::string* error) {
  auto* m = static_cast<Loaded*>(method);
  pthreadpool* pool = executorch::extension::threadpool::get_pthreadpool();
  size_t threads = pool != nullptr ? pthreadpool_get_threads_count(pool) : 0;
  if (pool != m->pool || threads != m->threads) {
    if (!load_method(m, error)) return 1;
  }
  if (n != m->inputs) {
    *error = std::to_string(n) + " tensors for a method of " + std::to_string(m->inputs) +
        " inputs";
    return 1;
  }
  for (size_t i = 0; i < n; ++i) {
    const Arg& a = args[i];
    Held& h = m->held[i];
    // ExecuTorch keeps an input handed over until another replaces it: the same memory
    // with the same sizes needs no new hand-over (a dynamic output the delegate resized
    // grows back within its bound on the next call, as ExecuTorch's own program's do)
    if (shaped_as_held(h, a)) {
      if (h.data == a.data) continue;
      if (h.shared) {
        // at other memory: for an unplanned input, what set_input would do after checking
        // what already holds (the dtype and sizes) is to share the new memory
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        m->method->mutable_input(i).toTensor().unsafeGetTensorImpl()->set_data(a.data);
#pragma GCC diagnostic pop
        h.data = a.data;
        continue;
      }
    }
    h.held = false;
    if (a.ndim < 0 || a.ndim > kMaxDims) {
      *error = "tensor " + std::to_string(i) + " has " + std::to_string(a.ndim) +
          " dims, over ExecuTorch's " + std::to_string(kMaxDims);
      return 1;
    }
    h.ndim = a.ndim;
    for (int64_t d = 0; d < a.ndim; ++d) {
      h.sizes[d] = static_cast<ea::SizesType>(a.sizes[d]);
      h.order[d] = static_cast<ea::DimOrderType>(a.dim_order[d]);
    }
    ea::StridesType step = 1;
    for (int64_t d = a.ndim - 1; d >= 0; --d) {
      h.strides[h.order[d]] = step;
      step *= h.sizes[h.order[d]];
    }
    ea::TensorImpl impl(
        static_cast<ea::ScalarType>(a.dtype), a.ndim, h.sizes, a.data, h.order, h.strides,
        et::TensorShapeDynamism::DYNAMIC_BOUND);
    et::Error e = m->method->set_input(et::EValue(ea::Tensor(&impl)), i);
    if (e != et::Error::Ok) {
      *error = "ExecuTorch refused tensor " + std::to_string(i) + " (error " + code(e) + ")";
      return 1;
    }
    h.data = a.data;
    h.dtype = a.dtype;
    h.held = true;
  }
  et::Error e = m->method->execute();
  if (e != et::Error::Ok) {
    for (Held& h : m->held) h.held = false;  // the next call hands everything over again
    *error = "ExecuTorch's execute failed (error " + code(e) + ")";
    return 1;
  }
  return 0;
}

int64_t et_sizes(void* method, size_t i, int64_t* sizes, int64_t capacity) {
  auto* m = static_cast<Loaded*>(method);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  const ea::Tensor& t = m->method->get_input(i).toTensor();
#pragma GCC diagnostic pop
  if (t.dim() > capacity) return -1;
  for (ssize_t d = 0; d < t.dim(); ++d) sizes[d] = t.size(d);
  return t.dim();
}

uint64_t et_loads(void* method) { return static_cast<Loaded*>(method)->loads; }

size_t et_hot(void* method, const void** out, size_t capacity) {
  auto* m = static_cast<Loaded*>(method);
  size_t n = 0;
  auto add = [&](const void* p, size_t bytes) { n = cache_lines(p, bytes, out, n, capacity); };
  add(m, 64);
  if (m->method.has_value()) add(&*m->method, sizeof(et::Method));
  // of each input record, the part a call compares (its memory, dtype, rank and the
  // first sizes)
  for (const Held& h : m->held) add(&h, offsetof(Held, sizes) + 4 * sizeof(ea::SizesType));
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  for (size_t i = 0; m->method.has_value() && i < m->inputs; ++i) {
    const et::EValue& v = m->method->get_input(i);
    add(&v, sizeof(v));
    if (v.isTensor()) add(v.toTensor().unsafeGetTensorImpl(), sizeof(ea::TensorImpl));
  }
#pragma GCC diagnostic pop
  return n;
}

}  // namespace ptexec_native
