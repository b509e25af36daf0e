// The ExecuTorch half of the native delegate calls (et_calls.h).
#include "et_calls.h"

#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/util/tensor_dimension_limit.h>
#include <executorch/runtime/core/freeable_buffer.h>
#include <executorch/runtime/executor/method_meta.h>
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
constexpr const char* kMethod = "forward";  // the one-delegate program's method

// One argument of the delegate: what was handed over last (its memory, dtype and sizes;
// `held` false: nothing, or a call failed) and its geometry as the delegate reads it,
// kept across calls (the tensor's object points at these arrays, and at the declared
// dim order: `sizes` are its sizes now, which the delegate changes where it resizes an
// output; `handed`, those handed).
struct Held {
  void* data = nullptr;
  int dtype = -1;
  bool held = false;
  int64_t ndim = 0;
  ea::SizesType handed[kMaxDims] = {};
  ea::SizesType sizes[kMaxDims] = {};
  ea::StridesType strides[kMaxDims] = {};
};

// What the program declares of an argument: a tensor handed over must match it, as
// ExecuTorch's Method::set_input requires of an unplanned input.
struct Declared {
  int dtype = -1;
  int64_t ndim = 0;
  int64_t numel = 1;  // at its bound
  bool fixed = true;  // a static shape: the sizes must be these
  ea::SizesType sizes[kMaxDims] = {};
  ea::DimOrderType order[kMaxDims] = {};
};

// The allocator the delegate may take scratch memory from during a call, emptied after
// the call where it did (`used`: in the record every call reads, so that a call that
// took none reads nothing more).
class Scratch final : public executorch::extension::MallocMemoryAllocator {
 public:
  explicit Scratch(bool* used) : used_(used) {}
  void* allocate(size_t size, size_t alignment = kDefaultAlignment) override {
    *used_ = true;
    return MallocMemoryAllocator::allocate(size, alignment);
  }

 private:
  bool* used_;
};

struct Loaded {
  // what every call reads first, together at the front
  pthreadpool* pool = nullptr;  // the pool the delegate's XNNPACK runtime was made with
  size_t threads = 0;
  size_t inputs = 0;  // the delegate's argument count
  uint64_t loads = 0;  // how many times the delegate was initialized
  bool scratch_used = false;  // the delegate took memory from `scratch` in this call
  const et::BackendInterface* backend = nullptr;
  et::DelegateHandle* handle = nullptr;
  et::EValue** args = nullptr;  // into `arg_data`: what execute reads
  // per argument, one record each, side by side: what a call compares is read from one
  // place (between two calls XNNPACK's work has pushed it out of the cache)
  std::vector<Held> held;
  std::vector<et::EValue*> arg_data;
  std::vector<et::EValue> values;  // each argument's value: its tensor
  std::vector<std::optional<ea::TensorImpl>> impls;
  std::vector<Declared> declared;
  // what the delegate is initialized from (again after a change of thread pool)
  const uint8_t* payload = nullptr;
  size_t payload_size = 0;
  std::vector<std::string> spec_keys;
  std::vector<std::string> spec_values;
  std::vector<et::CompileSpec> specs;
  executorch::extension::BufferDataLoader loader;
  std::optional<et::Program> program;
  const et::NamedDataMap* named = nullptr;
  executorch::extension::MallocMemoryAllocator runtime_allocator;
  Scratch scratch{&scratch_used};

  Loaded(const void* data, size_t size) : loader(data, size) {}
  Loaded(const Loaded&) = delete;
  Loaded& operator=(const Loaded&) = delete;
  ~Loaded() { release(); }

  void release() {
    if (handle != nullptr) backend->destroy(handle);
    handle = nullptr;
    runtime_allocator.reset();
  }
};

std::string code(et::Error e) { return std::to_string(static_cast<int>(e)); }

// (re)initializes the delegate with ExecuTorch's current thread pool, as Method::init
// would: the program's named data, a runtime allocator of its own, the method's name
bool init_delegate(Loaded* m, std::string* error) {
  ++m->loads;
  m->release();
  m->pool = executorch::extension::threadpool::get_pthreadpool();
  m->threads = m->pool != nullptr ? pthreadpool_get_threads_count(m->pool) : 0;
  et::FreeableBuffer processed(m->payload, m->payload_size, nullptr);
  et::BackendInitContext context(&m->runtime_allocator, nullptr, kMethod, m->named);
  auto handle = m->backend->init(
      context, &processed, et::ArrayRef<et::CompileSpec>(m->specs.data(), m->specs.size()));
  if (!handle.ok()) {
    *error = "ExecuTorch's backend could not initialize the delegate (error " +
        code(handle.error()) + ")";
    return false;
  }
  m->handle = handle.get();
  return true;
}

bool declare(Loaded* m, const et::MethodMeta& meta, const Delegate& d, std::string* error) {
  size_t n = meta.num_inputs();
  if (d.ntensors != n) {
    *error = "the program has " + std::to_string(n) + " inputs, the call " +
        std::to_string(d.ntensors) + " tensors";
    return false;
  }
  m->declared.assign(n, Declared{});
  for (size_t i = 0; i < n; ++i) {
    auto info = meta.input_tensor_meta(i);
    if (!info.ok() || info->is_memory_planned() || info->sizes().size() > kMaxDims ||
        info->dim_order().size() != info->sizes().size()) {
      *error = "input " + std::to_string(i) + " of the program is not an unplanned tensor";
      return false;
    }
    Declared& t = m->declared[i];
    t.dtype = static_cast<int>(info->scalar_type());
    t.ndim = static_cast<int64_t>(info->sizes().size());
    t.fixed = d.fixed[i] != 0;
    for (int64_t k = 0; k < t.ndim; ++k) {
      t.sizes[k] = info->sizes()[k];
      t.order[k] = info->dim_order()[k];
      t.numel *= t.sizes[k];
    }
  }
  return true;
}

// whether `a` may stand for the declared argument `t` (what set_input and resize_tensor
// check of an unplanned input): its dtype, rank and dim order, and its sizes, equal to
// the declared ones for a static shape, else no more elements than at the bound
bool fits(const Declared& t, const Arg& a) {
  if (a.dtype != t.dtype || a.ndim != t.ndim) return false;
  int64_t numel = 1;
  for (int64_t d = 0; d < a.ndim; ++d) {
    if (a.dim_order[d] != t.order[d] || a.sizes[d] < 0) return false;
    if (t.fixed && a.sizes[d] != t.sizes[d]) return false;
    numel *= a.sizes[d];
  }
  return numel <= t.numel;
}

}  // namespace

void* et_load(const void* data, size_t size, const Delegate& delegate, std::string* error) {
  et::runtime_init();
  if (delegate.payload_offset > size || delegate.payload_size > size - delegate.payload_offset) {
    *error = "the payload lies outside the program";
    return nullptr;
  }
  auto m = std::make_unique<Loaded>(data, size);
  auto program = et::Program::load(&m->loader, et::Program::Verification::InternalConsistency);
  if (!program.ok()) {
    *error = "ExecuTorch could not load the program (error " + code(program.error()) + ")";
    return nullptr;
  }
  m->program.emplace(std::move(program.get()));
  auto meta = m->program->method_meta(kMethod);
  if (!meta.ok()) {
    *error = "the program has no method 'forward' (error " + code(meta.error()) + ")";
    return nullptr;
  }
  auto name = meta->num_backends() == 1 ? meta->get_backend_name(0)
                                        : et::Result<const char*>(et::Error::InvalidProgram);
  m->backend = name.ok() ? et::get_backend_class(name.get()) : nullptr;
  if (m->backend == nullptr || !m->backend->is_available()) {
    *error = "ExecuTorch has no backend for the program's one delegate";
    return nullptr;
  }
  if (!declare(m.get(), meta.get(), delegate, error)) return nullptr;
  auto named = m->program->get_named_data_map();
  m->named = named.ok() ? named.get() : nullptr;
  m->payload = static_cast<const uint8_t*>(data) + delegate.payload_offset;
  m->payload_size = delegate.payload_size;
  for (size_t k = 0; k < delegate.nspecs; ++k) {
    m->spec_keys.emplace_back(delegate.specs[k].key);
    m->spec_values.emplace_back(static_cast<const char*>(delegate.specs[k].value),
                                delegate.specs[k].size);
  }
  for (size_t k = 0; k < delegate.nspecs; ++k) {
    m->specs.push_back(et::CompileSpec{
        m->spec_keys[k].c_str(), {m->spec_values[k].data(), m->spec_values[k].size()}});
  }
  size_t n = delegate.ntensors;
  m->inputs = n;
  m->held.assign(n, Held{});
  m->impls.resize(n);
  m->values.resize(n);
  m->arg_data.resize(n);
  for (size_t i = 0; i < n; ++i) m->arg_data[i] = &m->values[i];
  m->args = m->arg_data.data();
  if (!init_delegate(m.get(), error)) return nullptr;
  return m.release();
}

void et_free(void* method) { delete static_cast<Loaded*>(method); }

namespace {

// whether the argument was handed over last with this dtype and sizes (its dim order is
// the call's own, the same every call)
bool shaped_as_held(const Held& h, const Arg& a) {
  if (!h.held || h.dtype != a.dtype || h.ndim != a.ndim) return false;
  for (int64_t d = 0; d < a.ndim; ++d) {
    if (h.handed[d] != a.sizes[d]) return false;
  }
  return true;
}

}  // namespace

int et_run(void* method, size_t n, const Arg* args, std::string* error) {
  auto* m = static_cast<Loaded*>(method);
  pthreadpool* pool = executorch::extension::threadpool::get_pthreadpool();
  size_t threads = pool != nullptr ? pthreadpool_get_threads_count(pool) : 0;
  // (no handle: the last init or execute failed, and it is initialized again)
  if (m->handle == nullptr || pool != m->pool || threads != m->threads) {
    if (!init_delegate(m, error)) return 1;
  }
  if (n != m->inputs) {
    *error = std::to_string(n) + " tensors for a delegate of " + std::to_string(m->inputs) +
        " arguments";
    return 1;
  }
  for (size_t i = 0; i < n; ++i) {
    const Arg& a = args[i];
    Held& h = m->held[i];
    // the delegate reads each argument's memory (and an input's sizes) from its tensor on
    // every call: the sizes handed last time need no new tensor, only its memory where
    // that moved (an output the delegate resized keeps the bound it was handed with)
    if (shaped_as_held(h, a)) {
      if (h.data != a.data) {
        m->impls[i]->set_data(a.data);
        h.data = a.data;
      }
      continue;
    }
    h.held = false;
    if (a.ndim < 0 || a.ndim > kMaxDims || !fits(m->declared[i], a)) {
      *error = "tensor " + std::to_string(i) + " does not fit the delegate's argument " +
          "(its dtype, rank, dim order or sizes)";
      return 1;
    }
    Declared& t = m->declared[i];  // (its dim order is the argument's: `fits`)
    h.ndim = a.ndim;
    for (int64_t d = 0; d < a.ndim; ++d) {
      h.handed[d] = h.sizes[d] = static_cast<ea::SizesType>(a.sizes[d]);
    }
    ea::StridesType step = 1;
    for (int64_t d = a.ndim - 1; d >= 0; --d) {
      h.strides[t.order[d]] = step;
      step *= h.sizes[t.order[d]];
    }
    // a new tensor in place of the old (the argument's value points at this one place):
    // a dynamic one may be resized by the delegate up to these sizes
    m->impls[i].emplace(
        static_cast<ea::ScalarType>(a.dtype), a.ndim, h.sizes, a.data, t.order, h.strides,
        t.fixed ? et::TensorShapeDynamism::STATIC : et::TensorShapeDynamism::DYNAMIC_BOUND);
    if (!m->values[i].isTensor()) m->values[i] = et::EValue(ea::Tensor(&*m->impls[i]));
    h.data = a.data;
    h.dtype = a.dtype;
    h.held = true;
  }
  et::BackendExecutionContext context(nullptr, &m->scratch, kMethod);
  et::Error e = m->backend->execute(context, m->handle, et::Span<et::EValue*>(m->args, n));
  if (m->scratch_used) {
    m->scratch.reset();
    m->scratch_used = false;
  }
  if (e != et::Error::Ok) {
    for (Held& h : m->held) h.held = false;  // the next call hands everything over again
    // XNNPACK's runtimes share one workspace, and one that grows it sets up again every
    // runtime set up before; one whose last reshape failed fails that, and the growing
    // call with it: the runtime is destroyed, and the next call initializes it again
    m->release();
    *error = "ExecuTorch's backend failed to execute the delegate (error " + code(e) + ")";
    return 1;
  }
  return 0;
}

int64_t et_sizes(void* method, size_t i, int64_t* sizes, int64_t capacity) {
  auto* m = static_cast<Loaded*>(method);
  if (i >= m->inputs || !m->impls[i].has_value()) return -1;
  const ea::TensorImpl& t = *m->impls[i];
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
  // of each argument's record, the part a call compares (its memory, dtype, rank and the
  // first sizes handed); its value and tensor, which the delegate reads
  for (const Held& h : m->held) add(&h, offsetof(Held, handed) + 4 * sizeof(ea::SizesType));
  add(m->arg_data.data(), m->arg_data.size() * sizeof(et::EValue*));
  add(m->values.data(), m->values.size() * sizeof(et::EValue));
  add(m->impls.data(), m->impls.size() * sizeof(m->impls[0]));  // (the tensors, in place)
  if (m->handle != nullptr) add(m->handle, 64);
  return n;
}

}  // namespace ptexec_native
