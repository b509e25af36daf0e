// The torch half of the native delegate calls: a CPU kernel of ptexec::external_call
// that runs a delegate call with ExecuTorch's runtime without entering Python (see
// ptexec/compile/native.py). Calls it does not hold go to ptexec::external_call_python.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "et_calls.h"

// the library is built with hidden symbols (it is loaded into the global scope, where
// AOTInductor's generated code finds its C entry): these are what it exports
#define PTEXEC_EXPORT __attribute__((visibility("default")))

namespace ptexec_native {
namespace {

// whether x is laid out densely in dim order `order` (`nd` dims; a dim of size 1 may
// have any stride)
bool dense(const at::Tensor& x, const int64_t* order, int64_t nd) {
  if (x.dim() != nd) return false;
  auto sizes = x.sizes();
  auto strides = x.strides();
  int64_t step = 1;
  for (int64_t d = nd - 1; d >= 0; --d) {
    int64_t a = order[d];
    if (sizes[a] != 1 && strides[a] != step) return false;
    step *= sizes[a];
  }
  return true;
}

std::vector<int64_t> dense_strides(c10::IntArrayRef sizes, const int64_t* order, int64_t nd) {
  std::vector<int64_t> strides(sizes.size());
  int64_t step = 1;
  for (int64_t d = nd - 1; d >= 0; --d) {
    strides[order[d]] = step;
    step *= sizes[order[d]];
  }
  return strides;
}

// One delegate call: its one-delegate program (whose inputs are all the call's tensors,
// outputs included), whose delegate ExecuTorch's backend runs directly, and the outputs'
// memory, written by every call (shared with the Python path of the same call).
struct Call : torch::CustomClassHolder {
  at::Tensor program;  // the program's bytes, read in place by ExecuTorch
  void* delegate = nullptr;  // et_calls.h: the delegate, initialized
  std::vector<at::Tensor> outs;  // each output's memory (at its bound)
  // each argument the call reads and each it writes, with its dim order, all orders in
  // one array (between two calls XNNPACK's work has pushed the call's data out of the
  // cache; one array is fewer lines to bring back)
  struct Slot {
    int64_t arg;  // the argument's position
    int64_t ndim;
    const int64_t* order;  // into `order_data`
    bool dynamic;  // (an output) its shape is dynamic
  };
  std::vector<int64_t> order_data;
  std::vector<Slot> in_slots;  // per input, in order
  std::vector<Slot> out_slots;  // per output
  std::vector<Arg> args;
  // the tensors the last call returned (a dynamic output: its view at the shape the
  // delegate gave it); the next call returns the same view for the same shape, so that
  // a decode step makes no new view per call
  std::vector<at::Tensor> last;
  // per output, the views made for the last few shapes it came back with (the oldest
  // first): shapes that alternate (a prompt's, then a decode step's) make no new view
  static constexpr size_t kViews = 4;
  std::vector<std::vector<at::Tensor>> views;
  bool any_dynamic = false;
  std::mutex lock;
  // which init of the delegate this call's own addresses (`hot`, below) are of: read by
  // the call before it on every call, so among what a call prefetches of itself
  std::atomic<uint64_t> hot_loads{0};
  // The call that ran after this one last time, its key, and the addresses it reads
  // first (its own data, its outputs' tensors, the delegate's arguments) and the inputs it
  // got (their handles and tensors: the compiled code's memory settles, so a step's
  // tensors are mostly where the last one's were): the C entry prefetches them as this
  // call ends, so that the next call finds in the cache what XNNPACK's work pushed out.
  // A hint only: an address gone stale (its call freed, its delegate initialized again)
  // is a wasted prefetch, never a read.
  static constexpr size_t kHot = 40;
  static constexpr size_t kInputsAhead = 24;
  // of a tensor's object, the part a call reads (data, dtype, sizes, reference count)
  static constexpr size_t kImplBytes = 192;
  static constexpr size_t kImplLines = kImplBytes / 64;
  alignas(64) std::atomic<const Call*> next{nullptr};  // (the hints start a cache line)
  std::atomic<uint64_t> next_loads{0};  // the delegate's init `ahead` is of
  std::atomic<const char*> next_key{nullptr};
  std::atomic<size_t> ahead_count{0};
  std::atomic<size_t> inputs_ahead_count{0};
  std::atomic<const void*> ahead[kHot];
  std::atomic<const void*> inputs_ahead[kInputsAhead];
  // this call's own addresses, for the call before it (read when that one learns it is
  // followed by this one; the fields above are the last a call prefetches of itself),
  // found again when the delegate is initialized again (`hot_loads`)
  std::atomic<size_t> hot_count{0};
  std::atomic<const void*> hot[kHot];

  // `writes`: the argument positions the call writes, `dynamic` whether each output's
  // shape is dynamic, `outs_` their memory; `orders`: every argument's dim order;
  // `payload`: where the delegate's payload lies in the program (offset, size), its
  // compile specs (`spec_keys`, `spec_values`), and per argument whether its shape is
  // static (`fixed`)
  Call(at::Tensor program_, const std::vector<int64_t>& writes,
       const std::vector<int64_t>& dynamic, std::vector<at::Tensor> outs_,
       const std::vector<std::vector<int64_t>>& orders, const std::vector<int64_t>& payload,
       const std::vector<std::string>& spec_keys, const std::vector<at::Tensor>& spec_values,
       const std::vector<int64_t>& fixed)
      : program(std::move(program_)), outs(std::move(outs_)) {
    TORCH_CHECK(program.is_contiguous() && program.scalar_type() == at::kByte,
                "the program must be a dense uint8 tensor");
    TORCH_CHECK(writes.size() == outs.size() && dynamic.size() == outs.size(),
                "one position, dynamism and tensor per output");
    const int64_t count = static_cast<int64_t>(orders.size());
    std::vector<bool> written(count, false);
    for (size_t n = 0; n < writes.size(); ++n) {
      TORCH_CHECK(writes[n] >= 0 && writes[n] < count, "output position out of range");
      const auto& order = orders[writes[n]];
      TORCH_CHECK(dense(outs[n], order.data(), static_cast<int64_t>(order.size())),
                  "an output is not dense in its dim order");
      written[writes[n]] = true;
      any_dynamic = any_dynamic || dynamic[n] != 0;
    }
    std::vector<size_t> at(count);
    for (int64_t k = 0; k < count; ++k) {
      at[k] = order_data.size();
      order_data.insert(order_data.end(), orders[k].begin(), orders[k].end());
    }
    auto slot = [&](int64_t k, bool dynamic) {
      return Slot{k, static_cast<int64_t>(orders[k].size()), order_data.data() + at[k], dynamic};
    };
    for (int64_t k = 0; k < count; ++k) {
      if (!written[k]) in_slots.push_back(slot(k, false));
    }
    for (size_t n = 0; n < writes.size(); ++n) out_slots.push_back(slot(writes[n], dynamic[n] != 0));
    TORCH_CHECK(payload.size() == 2 && payload[0] >= 0 && payload[1] >= 0,
                "the payload is an offset and a size");
    TORCH_CHECK(spec_keys.size() == spec_values.size(), "one value per compile spec");
    TORCH_CHECK(static_cast<int64_t>(fixed.size()) == count, "one shape kind per argument");
    std::vector<Spec> specs;
    for (size_t k = 0; k < spec_keys.size(); ++k) {
      const at::Tensor& v = spec_values[k];
      TORCH_CHECK(v.is_contiguous() && v.scalar_type() == at::kByte,
                  "a compile spec's value must be a dense uint8 tensor");
      specs.push_back(Spec{spec_keys[k].c_str(), v.data_ptr(), v.nbytes()});
    }
    std::vector<uint8_t> statics(fixed.begin(), fixed.end());
    Delegate spec{static_cast<size_t>(payload[0]), static_cast<size_t>(payload[1]),
                  specs.data(), specs.size(), statics.data(), statics.size()};
    std::string error;
    delegate = et_load(program.data_ptr(), program.nbytes(), spec, &error);
    TORCH_CHECK(delegate != nullptr, error);
    args.resize(count);
    for (auto& a : ahead) a.store(nullptr, std::memory_order_relaxed);
    for (auto& a : inputs_ahead) a.store(nullptr, std::memory_order_relaxed);
    find_hot();
  }

  // this call's own addresses (`hot`), for the delegate as now initialized
  void find_hot() {
    const void* found[kHot];
    size_t n = 0;
    auto add = [&](const void* p, size_t bytes) { n = cache_lines(p, bytes, found, n, kHot); };
    // the fields a call reads before ExecuTorch's, up to the hints
    add(this, static_cast<size_t>(reinterpret_cast<const char*>(&next) -
                                  reinterpret_cast<const char*>(this)));
    add(in_slots.data(), in_slots.size() * sizeof(Slot));
    add(out_slots.data(), out_slots.size() * sizeof(Slot));
    add(order_data.data(), order_data.size() * sizeof(int64_t));
    add(args.data(), args.size() * sizeof(Arg));
    for (const at::Tensor& t : outs) add(t.unsafeGetTensorImpl(), kImplBytes);
    n += et_hot(delegate, found + n, kHot - n);
    for (size_t k = 0; k < n; ++k) hot[k].store(found[k], std::memory_order_relaxed);
    hot_count.store(n, std::memory_order_relaxed);
    hot_loads.store(et_loads(delegate), std::memory_order_relaxed);
  }

  // `after` ran right after this call (under `key`): its addresses are this call's
  // prefetches from now on
  void followed_by(const Call& after, const char* key) {
    uint64_t loads = after.hot_loads.load(std::memory_order_relaxed);
    if (next.load(std::memory_order_relaxed) == &after &&
        next_loads.load(std::memory_order_relaxed) == loads) {
      return;
    }
    size_t n = after.hot_count.load(std::memory_order_relaxed);
    for (size_t k = 0; k < n; ++k) {
      ahead[k].store(after.hot[k].load(std::memory_order_relaxed), std::memory_order_relaxed);
    }
    ahead_count.store(n, std::memory_order_relaxed);
    next_key.store(key, std::memory_order_relaxed);
    next.store(&after, std::memory_order_relaxed);
    next_loads.store(loads, std::memory_order_relaxed);
  }

  // the next call got the `count` tensors at `xs`
  void next_got(const at::Tensor* const* xs, size_t count) {
    const void* found[kInputsAhead];
    size_t n = 0;
    for (size_t j = 0; j < count && n + 1 + kImplLines <= kInputsAhead; ++j) {
      found[n++] = xs[j];
      n = cache_lines(xs[j]->unsafeGetTensorImpl(), kImplBytes, found, n, kInputsAhead);
    }
    for (size_t k = 0; k < n; ++k) inputs_ahead[k].store(found[k], std::memory_order_relaxed);
    inputs_ahead_count.store(n, std::memory_order_relaxed);
  }

  void prefetch_next() const {
    size_t n = ahead_count.load(std::memory_order_relaxed);
    for (size_t k = 0; k < n; ++k) __builtin_prefetch(ahead[k].load(std::memory_order_relaxed));
    n = inputs_ahead_count.load(std::memory_order_relaxed);
    for (size_t k = 0; k < n; ++k) {
      __builtin_prefetch(inputs_ahead[k].load(std::memory_order_relaxed));
    }
  }

  ~Call() override {
    if (delegate != nullptr) et_free(delegate);
  }

  static void describe(Arg& a, const at::Tensor& t, const Slot& s) {
    a.data = t.data_ptr();
    a.ndim = t.dim();
    a.sizes = t.sizes().data();
    a.dim_order = s.order;
    a.dtype = static_cast<int>(t.scalar_type());
  }

  std::vector<at::Tensor> run(at::TensorList xs) {
    c10::SmallVector<const at::Tensor*, 8> given;
    for (const at::Tensor& x : xs) given.push_back(&x);
    std::vector<at::Tensor> out;
    run(given.data(), given.size(), [&out](const std::vector<at::Tensor>& made) { out = made; });
    return out;
  }

  // runs the call on the `count` tensors at `xs`, then hands what it returns to `sink`
  // (while the call is still held: another thread's call of it may replace the views)
  template <class Sink>
  void run(const at::Tensor* const* xs, size_t count, Sink&& sink) {
    TORCH_CHECK(count == in_slots.size(), "a delegate call of ", in_slots.size(),
                " inputs got ", count);
    std::lock_guard<std::mutex> guard(lock);
    // dense copies of inputs that are not dense (rare; an Arg points into the copy's
    // TensorImpl, which stays where it is when the vector grows)
    std::vector<at::Tensor> copies;
    for (size_t j = 0; j < count; ++j) {
      const Slot& s = in_slots[j];
      const at::Tensor& x = *xs[j];
      TORCH_CHECK(x.dim() == s.ndim, "input ", j, " has ", x.dim(), " dims, the program ",
                  s.ndim);
      if (dense(x, s.order, s.ndim)) {
        describe(args[s.arg], x, s);
      } else {
        copies.push_back(
            at::empty_strided(x.sizes(), dense_strides(x.sizes(), s.order, s.ndim), x.options()));
        copies.back().copy_(x);
        describe(args[s.arg], copies.back(), s);
      }
    }
    for (size_t n = 0; n < outs.size(); ++n) describe(args[out_slots[n].arg], outs[n], out_slots[n]);
    std::string error;
    TORCH_CHECK(et_run(delegate, args.size(), args.data(), &error) == 0, error);
    if (et_loads(delegate) != hot_loads.load(std::memory_order_relaxed)) find_hot();  // (a new pool)
    // what is read next (the tensors handed back, their shapes and reference counts; the
    // hints for the next call) XNNPACK's work has pushed out of the cache: their misses
    // overlap from here
    const char* hints = reinterpret_cast<const char*>(&next);
    for (const char* at = hints; at < reinterpret_cast<const char*>(&hot_count); at += 64) {
      __builtin_prefetch(at);
    }
    for (const at::Tensor& t : last.size() == outs.size() ? last : outs) {
      const void* lines[kImplLines];
      size_t n = cache_lines(t.unsafeGetTensorImpl(), kImplBytes, lines, 0, kImplLines);
      for (size_t k = 0; k < n; ++k) __builtin_prefetch(lines[k]);
    }
    if (!any_dynamic) {
      sink(outs);
      return;
    }
    if (last.size() != outs.size()) last = outs;
    int64_t sizes[16];
    for (size_t n = 0; n < outs.size(); ++n) {
      const Slot& s = out_slots[n];
      if (!s.dynamic) continue;
      const int64_t nd = et_sizes(delegate, s.arg, sizes, 16);
      TORCH_CHECK(nd == s.ndim, "output ", n, " came back with another rank");
      c10::IntArrayRef shape(sizes, nd);
      if (last[n].sizes() != shape) last[n] = view(n, shape);
    }
    sink(last);
  }

  // output n's view at `shape` (dense in its dim order): one made before for that shape,
  // else a new one, kept in place of the oldest
  at::Tensor view(size_t n, c10::IntArrayRef shape) {
    if (views.size() != outs.size()) views.resize(outs.size());
    auto& made = views[n];
    for (const at::Tensor& v : made) {
      if (v.sizes() == shape) return v;
    }
    const Slot& s = out_slots[n];
    at::Tensor v = outs[n].as_strided(shape, dense_strides(shape, s.order, s.ndim));
    if (made.size() >= kViews) made.erase(made.begin());
    made.push_back(v);
    return v;
  }
};

std::atomic<uint64_t> versions{1};  // (each table's, and each change of one: never reused)

// The calls of one method, by key; the thread running the method's compiled code makes
// them current (ptexec_native_use). `version` is new whenever a call is added or replaced,
// so that what a thread found under an older one is not used again (find_entry).
struct Table : torch::CustomClassHolder {
  std::deque<std::string> keys;  // the map's keys (a deque: they never move)
  std::unordered_map<std::string_view, c10::intrusive_ptr<Call>> calls;
  uint64_t version = versions.fetch_add(1);
  void add(const std::string& key, c10::intrusive_ptr<Call> call) {
    version = versions.fetch_add(1);
    auto found = calls.find(std::string_view(key));
    if (found != calls.end()) {
      found->second = std::move(call);
      return;
    }
    keys.push_back(key);
    calls.emplace(std::string_view(keys.back()), std::move(call));
  }
  int64_t address() { return static_cast<int64_t>(reinterpret_cast<intptr_t>(this)); }
};

thread_local const Table* current = nullptr;
std::atomic<int64_t> runs{0};  // calls run here, in this process
std::atomic<int64_t> entries{0};  // calls that came in through the C entry

// the call of this thread's current table under `key`, or null
Call* find(std::string_view key) {
  if (current == nullptr) return nullptr;
  auto found = current->calls.find(key);  // no copy
  if (found == current->calls.end()) return nullptr;
  runs.fetch_add(1, std::memory_order_relaxed);
  return found->second.get();
}

// What this thread found through the C entry, by the key's address: AOTInductor's code
// passes each call site's key as a string of its library, at the same address on every
// call, so a hit costs a probe or two of a small table where the map would hash and
// compare the key (about 70 characters). An entry holds for the table version it was
// found in (a table alive and unchanged keeps its calls alive); a call site of another
// library or table, or a key that merely shares an address, misses and is looked up.
struct Found {
  const char* key = nullptr;
  uint64_t version = 0;
  Call* call = nullptr;
};

// Open addressing with linear probing, at most half full: every call site a thread runs
// keeps its own entry (a program of a few hundred call sites misses only on its first
// call of each). Entries are never removed, only replaced under their key; past
// kMaxFound keys (call sites of many libraries in one thread) the table starts afresh.
class FoundByAddress {
 public:
  // the entry of `key`, or the empty one where it would go
  Found& at(const char* key) {
    if (slots_.empty()) slots_.resize(kFirst);
    size_t mask = slots_.size() - 1;
    size_t i = hash(key) & mask;
    while (slots_[i].key != nullptr && slots_[i].key != key) i = (i + 1) & mask;
    return slots_[i];
  }

  // keeps `found` (whose key `at` gave `slot` for, with no call between)
  void keep(Found& slot, const Found& found) {
    bool added = slot.key == nullptr;
    slot = found;
    if (!added || 2 * ++used_ <= slots_.size()) return;
    if (used_ > kMaxFound) {
      slots_.assign(kFirst, Found{});
      used_ = 0;
      return;
    }
    std::vector<Found> old(slots_.size() * 2);
    old.swap(slots_);
    size_t mask = slots_.size() - 1;
    for (const Found& f : old) {
      if (f.key == nullptr) continue;
      size_t i = hash(f.key) & mask;
      while (slots_[i].key != nullptr) i = (i + 1) & mask;
      slots_[i] = f;
    }
  }

  // where `key`'s entry is looked for first (nothing is read: for a prefetch)
  const void* where(const char* key) const {
    return slots_.empty() ? nullptr : &slots_[hash(key) & (slots_.size() - 1)];
  }

 private:
  static constexpr size_t kFirst = 16;  // (a power of two; grows with the call sites)
  static constexpr size_t kMaxFound = size_t{1} << 14;
  static size_t hash(const char* key) {
    auto a = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(key));
    return static_cast<size_t>((a * 0x9E3779B97F4A7C15ull) >> 32);
  }
  std::vector<Found> slots_;
  size_t used_ = 0;
};

thread_local FoundByAddress found_by_address;

Call* find_entry(const char* key) {
  if (current == nullptr) return nullptr;
  Found& slot = found_by_address.at(key);
  if (slot.key == key && slot.version == current->version) {
    runs.fetch_add(1, std::memory_order_relaxed);
    return slot.call;
  }
  Call* call = find(std::string_view(key));
  if (call != nullptr) found_by_address.keep(slot, Found{key, current->version, call});
  return call;
}

// The call this thread's C entry ran last, with the table it was found in and that
// table's version: while the same table, unchanged, is current, that call is alive and
// learns which call follows it (Call::followed_by).
struct Previous {
  const Table* table = nullptr;
  uint64_t version = 0;
  Call* call = nullptr;
};

thread_local Previous previous;

// `call` (found under `key`, or null) is the call this thread runs now, on the `count`
// tensors at `xs`
void ran_next(Call* call, const char* key, const at::Tensor* const* xs, size_t count) {
  Previous& p = previous;
  if (call != nullptr && p.call != nullptr && p.table == current && p.version == current->version) {
    p.call->followed_by(*call, key);
    p.call->next_got(xs, count);
  }
  p = call != nullptr ? Previous{current, current->version, call} : Previous{};
}

// as `call` ends: what the call after it read last time, and where that call is found
void prefetch_after(const Call& call) {
  call.prefetch_next();
  const char* key = call.next_key.load(std::memory_order_relaxed);
  if (key != nullptr) __builtin_prefetch(found_by_address.where(key));
  if (current != nullptr) __builtin_prefetch(&current->version);
}

std::vector<at::Tensor> python_call(c10::string_view key, at::TensorList inputs) {
  static auto python = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("ptexec::external_call_python", "")
                           .typed<std::vector<at::Tensor>(c10::string_view, at::TensorList)>();
  return python.call(key, inputs);
}

std::vector<at::Tensor> external_call(c10::string_view key, at::TensorList inputs) {
  Call* call = find(std::string_view(key.data(), key.size()));
  return call != nullptr ? call->run(inputs) : python_call(key, inputs);
}

}  // namespace
}  // namespace ptexec_native

// Makes `table` (a Table's address, 0 for none) the calls this thread's compiled code
// finds first; returns the one before. The caller keeps the table alive meanwhile.
extern "C" PTEXEC_EXPORT int64_t ptexec_native_use(int64_t table) {
  auto before = static_cast<int64_t>(reinterpret_cast<intptr_t>(ptexec_native::current));
  ptexec_native::current = reinterpret_cast<const ptexec_native::Table*>(static_cast<intptr_t>(table));
  return before;
}

namespace ptexec_native {
namespace {

AOTITorchError shim_call(const char* key, const AtenTensorHandle* inputs, int64_t count,
                         va_list* outputs) {
  entries.fetch_add(1, std::memory_order_relaxed);
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    // the inputs as they are (no new references), on the stack for up to eight
    c10::SmallVector<const at::Tensor*, 8> xs;
    for (int64_t j = 0; j < count; ++j) {
      xs.push_back(torch::aot_inductor::tensor_handle_to_tensor_pointer(inputs[j]));
    }
    auto hand_out = [outputs](const std::vector<at::Tensor>& made) {
      for (const at::Tensor& t : made) {
        // null where the code reads no such output (AOTInductor passes none for it)
        AtenTensorHandle* slot = va_arg(*outputs, AtenTensorHandle*);
        if (slot != nullptr) *slot = torch::aot_inductor::new_tensor_handle(at::Tensor(t));
      }
    };
    Call* call = find_entry(key);
    ran_next(call, key, xs.data(), xs.size());
    if (call != nullptr) {
      call->run(xs.data(), xs.size(), hand_out);
      prefetch_after(*call);
    } else {
      std::vector<at::Tensor> given;
      for (const at::Tensor* x : xs) given.push_back(*x);
      hand_out(python_call(key, given));
    }
  });
  return AOTI_TORCH_SUCCESS;
}

}  // namespace
}  // namespace ptexec_native

// The op's C entry for AOTInductor's generated code (its "C shim", named as AOTInductor
// names one: aoti_torch_<device>_<op>), called directly instead of through the proxy
// executor and torch's dispatcher: the key, the inputs' handles and their count, then one
// `AtenTensorHandle*` per output, which receives a new handle of that output (the output
// count is the call's, as traced; null for an output the code does not read). The caller
// keeps its inputs' handles.
extern "C" PTEXEC_EXPORT AOTITorchError aoti_torch_cpu_external_call(
    const char* key, const AtenTensorHandle* inputs, int64_t count, ...) {
  va_list outputs;
  va_start(outputs, count);
  AOTITorchError status = ptexec_native::shim_call(key, inputs, count, &outputs);
  va_end(outputs);
  return status;
}

// How many calls the kernel ran with a table's call (for tests and diagnostics).
extern "C" PTEXEC_EXPORT int64_t ptexec_native_runs() { return ptexec_native::runs.load(); }

// How many calls came in through the C entry, whoever ran them (likewise).
extern "C" PTEXEC_EXPORT int64_t ptexec_native_entry_runs() {
  return ptexec_native::entries.load();
}

TORCH_LIBRARY(ptexec_native, m) {
  m.class_<ptexec_native::Call>("Call")
      .def(torch::init<at::Tensor, std::vector<int64_t>, std::vector<int64_t>,
                       std::vector<at::Tensor>, std::vector<std::vector<int64_t>>,
                       std::vector<int64_t>, std::vector<std::string>,
                       std::vector<at::Tensor>, std::vector<int64_t>>())
      .def("run", [](const c10::intrusive_ptr<ptexec_native::Call>& self,
                     std::vector<at::Tensor> xs) { return self->run(xs); });
  m.class_<ptexec_native::Table>("Table")
      .def(torch::init<>())
      .def("add", &ptexec_native::Table::add)
      .def("address", &ptexec_native::Table::address);
}

TORCH_LIBRARY_IMPL(ptexec, CPU, m) { m.impl("external_call", &ptexec_native::external_call); }
