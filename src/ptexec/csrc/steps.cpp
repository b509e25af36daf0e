// Runs of a method's instructions as prepared boxed calls of torch's operators, without
// entering Python between them (see ptexec/native.py). A run holds, per step, the
// operator's handle and its whole argument stack (the method's own tensors, which keep
// their objects from call to call, and fixed values), both found once when it is made.
// Running it copies each stack and calls the operator's boxed kernel below autograd: the
// operator and arguments the Python statement would call. A step that fails or warns
// stops the run: run() returns its position, and the caller has stopped() raise its
// error (as torch's bindings raise it) or issue its warnings on the step's own line. A
// step that warned ran; the caller runs the steps after it in Python.
//
// Also, for the loader: the planned tensors of a values table made in one call (Views),
// and, for the fast call, its inputs' common checks (Guard), their copies into planned
// memory (Puts) and the output copies (copies), each in one call.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/EmptyTensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <exception>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// keeps the warnings a step raises (issued in Python by Steps::stopped)
class Noted : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override { kept.push_back(w); }
  std::vector<c10::Warning> kept;
};

// An argument read from a method's values table: the tensor in one slot (seen with the
// sizes `view` where there are some), or the list of the tensors in several (of optional
// tensors where the schema says so).
struct Place {
  size_t arg;
  std::vector<int64_t> slots;
  bool list;
  bool optional_items;
  std::optional<std::vector<int64_t>> view;
};

struct Step {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;
  std::vector<at::Tensor> empties;  // emptied first (resized to no elements), when asked
  std::vector<at::Tensor> always;  // emptied first on every run
  // where the arguments and the tensors to empty come from (a template's steps hold no
  // tensors: bind() reads them from a load's values table)
  std::vector<Place> places;
  std::vector<int64_t> empty_slots;
  std::vector<int64_t> always_slots;
};

// The operator named `name.overload`, found once per process (called with the GIL).
const c10::OperatorHandle& find(const std::string& name, const std::string& overload) {
  static std::unordered_map<std::string, c10::OperatorHandle> found;
  std::string key = name + "." + overload;
  auto it = found.find(key);
  if (it == found.end()) {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
    it = found.emplace(std::move(key), op).first;
  }
  return it->second;
}

class Steps {
 public:
  // Adds a call of `name.overload` with `args` (one per argument of its schema, in order);
  // `empties`: tensors emptied before it when run() is asked to, `always`: on every run.
  // Raises when the operator is unknown or an argument does not convert to its type.
  //
  // `places` (one per argument, in order: (kind, slots), kind 0 a fixed value, 1 the
  // tensor of slots[0], 2 the list of those of slots, 3 the tensor of slots[0] seen with
  // the sizes slots[1:], as Tensor.view makes it) and the slots `empty_slots` and
  // `always_slots` of `empties` and `always` say where each comes from in the values
  // table: this object is then a template, which keeps none of these tensors, and bind()
  // makes the steps of a load.
  void add(const std::string& name, const std::string& overload, const py::sequence& args,
           const std::vector<at::Tensor>& empties, const std::vector<at::Tensor>& always,
           const std::vector<std::pair<int64_t, std::vector<int64_t>>>& places,
           const std::vector<int64_t>& empty_slots, const std::vector<int64_t>& always_slots) {
    const c10::OperatorHandle& op = find(name, overload);
    const auto& schema = op.schema();
    const auto& arguments = schema.arguments();
    if (static_cast<size_t>(py::len(args)) != arguments.size()) {
      throw std::invalid_argument(name + "." + overload + ": " + std::to_string(py::len(args)) +
                                  " arguments given, the schema has " +
                                  std::to_string(arguments.size()));
    }
    if (places.size() != arguments.size() || empty_slots.size() != empties.size() ||
        always_slots.size() != always.size()) {
      throw std::invalid_argument(name + "." + overload + ": one place per argument");
    }
    std::vector<c10::IValue> stack;
    stack.reserve(arguments.size());
    std::vector<Place> where;
    for (size_t k = 0; k < arguments.size(); ++k) {
      const auto& type = arguments[k].real_type();
      stack.push_back(torch::jit::toIValue(args[k], type));
      const auto& [kind, slots] = places[k];
      if (kind == 0) continue;
      if (kind < 0 || kind > 3 || (kind != 2 && slots.empty())) {
        throw std::invalid_argument(name + ": a place of an unknown kind");
      }
      bool optional_items = false;
      std::optional<std::vector<int64_t>> view;
      std::vector<int64_t> read = slots;
      if (kind == 3) {
        view = std::vector<int64_t>(slots.begin() + 1, slots.end());
        read = {slots[0]};
      }
      if (kind == 2) {
        const auto* list = type->castRaw<c10::ListType>();
        if (list == nullptr) throw std::invalid_argument(name + ": a list where none goes");
        optional_items = list->getElementType()->kind() == c10::TypeKind::OptionalType;
      } else if (!stack.back().isTensor()) {
        throw std::invalid_argument(name + ": a tensor's place holds no tensor");
      }
      where.push_back(Place{k, read, kind == 2, optional_items, view});
      template_ = true;
      stack.back() = c10::IValue();  // (a template holds no load's tensors)
    }
    if (stack.size() > widest_) widest_ = stack.size();
    steps_.push_back(Step{op, std::move(stack), {}, {}, std::move(where), empty_slots,
                          always_slots});
  }

  // The steps of a load: this template's, with the tensors of `values` (the load's values
  // table) in their places. Raises when a place holds no tensor.
  Steps bind(const py::list& values) const {
    Steps made;
    made.widest_ = widest_;
    made.steps_.reserve(steps_.size());
    auto tensor = [&](int64_t j) { return values[static_cast<size_t>(j)].cast<at::Tensor>(); };
    for (const Step& s : steps_) {
      Step step{s.op, s.args, {}, {}, {}, {}, {}};
      for (const Place& p : s.places) {
        if (p.view.has_value()) {
          step.args[p.arg] = tensor(p.slots[0]).view(*p.view);  // (raises where it cannot)
        } else if (!p.list) {
          step.args[p.arg] = tensor(p.slots[0]);
        } else if (p.optional_items) {
          c10::List<std::optional<at::Tensor>> items;
          for (int64_t j : p.slots) items.push_back(tensor(j));
          step.args[p.arg] = std::move(items);
        } else {
          c10::List<at::Tensor> items;
          for (int64_t j : p.slots) items.push_back(tensor(j));
          step.args[p.arg] = std::move(items);
        }
      }
      for (int64_t j : s.empty_slots) step.empties.push_back(tensor(j));
      for (int64_t j : s.always_slots) step.always.push_back(tensor(j));
      made.steps_.push_back(std::move(step));
    }
    return made;
  }

  size_t size() const { return steps_.size(); }

  // Runs every step in order; -1 when all ran, else the position of the step that failed
  // or warned (see stopped()). The steps after it did not run.
  int64_t run(bool empty) {
    if (template_) throw std::logic_error("a template's steps run once bound to a load");
    at::AutoDispatchBelowAutograd below;
    Noted noted;
    c10::WarningUtils::WarningHandlerGuard watch(&noted);
    stopped_at_ = -1;
    warnings_.clear();
    error_ = nullptr;
    torch::jit::Stack stack;
    stack.reserve(widest_ + 1);
    const int64_t n = static_cast<int64_t>(steps_.size());
    for (int64_t k = 0; k < n; ++k) {
      Step& s = steps_[k];
      try {
        for (auto& t : s.always) t.resize_({0});
        if (empty) {
          for (auto& t : s.empties) t.resize_({0});
        }
        stack.assign(s.args.begin(), s.args.end());
        s.op.callBoxed(stack);
      } catch (...) {
        stopped_at_ = k;
        error_ = std::current_exception();
        warnings_ = std::move(noted.kept);  // raised before the error, as in Python
        return k;
      }
      if (!noted.kept.empty()) {
        stopped_at_ = k;
        warnings_ = std::move(noted.kept);
        return k;
      }
    }
    return -1;
  }

  // Called with the GIL, for the step k at which the last run stopped: issues its
  // warnings and raises its error as torch's bindings do (their messages, categories and
  // exception types), or, after warnings alone, returns true: the step ran. False for
  // any other k.
  bool stopped(int64_t k) {
    if (stopped_at_ < 0 || stopped_at_ != k) return false;
    stopped_at_ = -1;
    std::exception_ptr error = error_;
    error_ = nullptr;
    auto kept = std::move(warnings_);
    warnings_.clear();
    // as torch's bindings do (HANDLE_TH_ERRORS): the warnings through its handler, which
    // issues them when it goes, then the error, translated
    try {
      torch::PyWarningHandler handler;
      for (const auto& w : kept) c10::warn(w);
      if (error) {
        handler.set_in_exception();
        std::rethrow_exception(error);
      }
    } catch (python_error& e) {
      e.restore();
      throw py::error_already_set();
    } catch (py::error_already_set&) {
      throw;
    } catch (...) {
      torch::translate_exception_to_python(std::current_exception());
      throw py::error_already_set();
    }
    return true;
  }

 private:
  std::vector<Step> steps_;
  size_t widest_ = 0;
  bool template_ = false;
  int64_t stopped_at_ = -1;
  std::vector<c10::Warning> warnings_;
  std::exception_ptr error_;
};

// A copy of `object` as the self of a builtin function of one argument (`def`, whose
// function reads it back with `self_of<T>`): a call then costs what calling a builtin
// costs, where a bound method of a pybind11 class costs its argument handling (about
// 0.1 us) on every call.
template <class T>
py::object builtin(const T& object, PyMethodDef* def) {
  auto* copy = new T(object);
  PyObject* capsule = PyCapsule_New(copy, T::kCapsule, [](PyObject* c) {
    delete static_cast<T*>(PyCapsule_GetPointer(c, T::kCapsule));
  });
  if (capsule == nullptr) {
    delete copy;
    throw py::error_already_set();
  }
  PyObject* fn = PyCFunction_New(def, capsule);
  Py_DECREF(capsule);  // (the function holds it)
  if (fn == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(fn);
}

template <class T>
const T* self_of(PyObject* capsule) {
  return static_cast<const T*>(PyCapsule_GetPointer(capsule, T::kCapsule));
}

// The item at `position` of a list or tuple (borrowed), or null.
PyObject* item(PyObject* seq, size_t position) {
  if (PyList_Check(seq)) {
    return position < static_cast<size_t>(PyList_GET_SIZE(seq)) ? PyList_GET_ITEM(seq, position)
                                                                 : nullptr;
  }
  if (PyTuple_Check(seq)) {
    return position < static_cast<size_t>(PyTuple_GET_SIZE(seq)) ? PyTuple_GET_ITEM(seq, position)
                                                                  : nullptr;
  }
  return nullptr;
}

// The common checks of a fast call's tensor inputs, made once per load: each entry's
// input (by its position in the call's list or tuple) must be a torch.Tensor itself (no
// subclass), of the entry's dtype, a strided CPU tensor that requires no grad, of the
// entry's sizes (or, bounded, of as many sizes, each from 1 to the entry's), contiguous
// where the entry asks it, and its bytes must lie apart from every range given (the
// method's planned memory). These are the checks the generated Python would make
// (ptexec/engine/fastcall.py): any input that fails them, or that they cannot read, sends
// the call to the general path.
class Guard {
 public:
  // entries: (position, dtype, sizes, contiguous, bounded); ranges: (start, end) addresses
  Guard(const py::list& entries, const std::vector<std::pair<uintptr_t, uintptr_t>>& ranges)
      : ranges_(ranges) {
    entries_.reserve(entries.size());
    for (const auto& h : entries) {
      auto e = h.cast<py::tuple>();
      if (e.size() != 5) throw std::invalid_argument("a guard's entry has five fields");
      Entry x;
      x.position = e[0].cast<size_t>();
      x.dtype = torch::jit::toIValue(e[1], c10::ScalarTypeType::get()).toScalarType();
      x.sizes = e[2].cast<std::vector<int64_t>>();
      x.contiguous = e[3].cast<bool>();
      x.bounded = e[4].cast<bool>();
      size_t count = 1;
      for (int64_t n : x.sizes) {
        if (n < 0 || __builtin_mul_overflow(count, static_cast<size_t>(n), &count)) {
          throw std::invalid_argument("a guard's sizes are negative or overflow");
        }
      }
      if (__builtin_mul_overflow(count, c10::elementSize(x.dtype), &x.nbytes)) {
        throw std::invalid_argument("a guard's sizes overflow");
      }
      entries_.push_back(std::move(x));
    }
  }

  // Whether every entry's input passes (called with the GIL).
  bool check(const py::handle& inputs) const {
    PyObject* seq = inputs.ptr();
    const auto* tensor_type = reinterpret_cast<PyTypeObject*>(THPVariableClass);
    try {
      for (const Entry& x : entries_) {
        PyObject* obj = item(seq, x.position);
        if (obj == nullptr || tensor_type == nullptr || Py_TYPE(obj) != tensor_type) {
          return false;
        }
        const at::Tensor& t = THPVariable_Unpack(obj);
        if (t.scalar_type() != x.dtype || !t.is_cpu() || t.requires_grad() ||
            t.layout() != at::kStrided) {
          return false;
        }
        const c10::IntArrayRef sizes = t.sizes();
        if (!x.bounded) {
          if (sizes != c10::IntArrayRef(x.sizes)) return false;
        } else {
          if (sizes.size() != x.sizes.size()) return false;
          for (size_t d = 0; d < sizes.size(); ++d) {
            if (sizes[d] < 1 || sizes[d] > x.sizes[d]) return false;
          }
        }
        if (x.contiguous && !t.is_contiguous()) return false;
        if (ranges_.empty()) continue;
        if (!t.has_storage()) return false;
        const auto p = reinterpret_cast<uintptr_t>(t.data_ptr());
        const uintptr_t q = p + (x.bounded ? t.nbytes() : x.nbytes);
        for (const auto& [start, end] : ranges_) {
          if (!(q <= start || p >= end)) return false;
        }
      }
    } catch (...) {  // a tensor whose facts cannot be read: the general path says why
      return false;
    }
    return true;
  }

  size_t size() const { return entries_.size(); }

  // The checks as a builtin function of the inputs (its own copy of this guard).
  py::object function() const { return builtin(*this, &kDef); }

  static constexpr const char* kCapsule = "ptexec_steps.Guard";

 private:
  static PyObject* call(PyObject* self, PyObject* inputs) {
    const Guard* guard = self_of<Guard>(self);
    if (guard == nullptr) return nullptr;
    if (guard->check(inputs)) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
  }

  static inline PyMethodDef kDef = {"guard", call, METH_O,
                                    "Whether the inputs pass the fast call's checks."};

  struct Entry {
    size_t position;
    c10::ScalarType dtype;
    std::vector<int64_t> sizes;
    bool contiguous;
    bool bounded;
    size_t nbytes;  // (of the sizes themselves: the bounds' when bounded)
  };
  std::vector<Entry> entries_;
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges_;
};

// The copies of a fast call's planned inputs into their views, made once per load: for
// each entry (position, the view's address, its bytes, whether they are a bound), the
// input that passed the guard is copied as bytes when it is dense (contiguous, its memory
// holding its values, at a nonzero address: a ZeroTensor has none) and of exactly the
// view's bytes (of at most the bound's: a bounded view is resized to the input's sizes
// first, in place); the others are left to torch's copy (the bits of their positions in
// the result). As the generated Python's memmove does.
class Puts {
 public:
  explicit Puts(const std::vector<std::tuple<size_t, uintptr_t, size_t, bool>>& entries) {
    for (const auto& [position, address, bytes, bounded] : entries) {
      if (position >= 63) throw std::invalid_argument("an input past the 63rd");
      if (address == 0) throw std::invalid_argument("a view at no address");
      entries_.push_back(Entry{position, reinterpret_cast<void*>(address), bytes, bounded});
    }
  }

  // The positions (as bits) of the inputs to copy with torch; the others are copied.
  int64_t put(PyObject* inputs) const {
    const auto* tensor_type = reinterpret_cast<PyTypeObject*>(THPVariableClass);
    int64_t left = 0;
    struct Copy {
      void* to;
      const void* from;
      size_t bytes;
    };
    std::vector<Copy> large;  // copied after the others, without the GIL (as torch's copy_)
    for (const Entry& e : entries_) {
      PyObject* obj = item(inputs, e.position);
      bool found = false;
      if (obj != nullptr && tensor_type != nullptr && Py_TYPE(obj) == tensor_type) {
        try {
          const at::Tensor& t = THPVariable_Unpack(obj);
          const size_t bytes = t.nbytes();
          if (t.is_cpu() && t.layout() == at::kStrided && t.is_contiguous() && !t.is_neg() &&
              !t.is_conj() && t.has_storage() &&
              (e.bounded ? bytes <= e.bytes : bytes == e.bytes)) {
            const void* from = t.data_ptr();
            if (from != nullptr) {
              if (bytes < kReleaseBytes) {
                std::memmove(e.to, from, bytes);
              } else {
                large.push_back(Copy{e.to, from, bytes});
              }
              found = true;
            }
          }
        } catch (...) {  // (torch's copy then says what is wrong)
        }
      }
      if (!found) left |= int64_t{1} << e.position;
    }
    if (!large.empty()) {
      // the caller's list holds the inputs for the call: their memory stays meanwhile
      py::gil_scoped_release released;
      for (const Copy& c : large) std::memmove(c.to, c.from, c.bytes);
    }
    return left;
  }

  py::object function() const { return builtin(*this, &kDef); }

  size_t size() const { return entries_.size(); }

  static constexpr const char* kCapsule = "ptexec_steps.Puts";
  static constexpr size_t kReleaseBytes = size_t{1} << 16;  // copied without the GIL from here

 private:
  static PyObject* call(PyObject* self, PyObject* inputs) {
    const Puts* puts = self_of<Puts>(self);
    if (puts == nullptr) return nullptr;
    return PyLong_FromLongLong(puts->put(inputs));
  }

  static inline PyMethodDef kDef = {"put", call, METH_O,
                                    "Copies the inputs into their views; the ones left."};

  struct Entry {
    size_t position;
    void* to;
    size_t bytes;
    bool bounded;
  };
  std::vector<Entry> entries_;
};

// New tensors holding what `tensors` hold, as Tensor.clone() makes them: a dense CPU
// tensor is copied as bytes into new memory of its sizes and strides (as clone keeps them),
// any other is cloned by torch.
std::vector<at::Tensor> copies(const std::vector<at::Tensor>& tensors) {
  at::AutoDispatchBelowAutograd below;
  std::vector<at::Tensor> made;
  made.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() &&
        !t.is_neg() && !t.is_conj() && !t.is_quantized() && t.numel() > 0 &&
        t.data_ptr() != nullptr) {
      // (the CPU allocation itself: what empty_strided dispatches to, without the dispatch)
      at::Tensor copy = at::detail::empty_strided_cpu(t.sizes(), t.strides(), t.scalar_type());
      std::memcpy(copy.data_ptr(), t.data_ptr(), t.nbytes());
      made.push_back(std::move(copy));
    } else {
      made.push_back(t.clone());
    }
  }
  return made;
}

// The planned tensors of a values table: each a view of one planned CPU buffer (its
// storage, an element offset, sizes and strides), made for a load in one call: the tensor
// the loader's Python makes (an empty tensor of the dtype, then set_), made directly.
class Views {
 public:
  // entries: (slot, memory id, element offset, dtype, sizes, strides), the last two tuples
  explicit Views(const py::list& entries) {
    views_.reserve(entries.size());
    for (const auto& h : entries) {
      auto e = h.cast<py::tuple>();
      View v;
      v.slot = e[0].cast<size_t>();
      v.memory_id = e[1].cast<size_t>();
      v.offset = e[2].cast<int64_t>();
      v.dtype = torch::jit::toIValue(e[3], c10::ScalarTypeType::get()).toScalarType();
      v.sizes = e[4].cast<std::vector<int64_t>>();
      v.strides = e[5].cast<std::vector<int64_t>>();
      v.bytes = extent(v);
      v.offset_obj = py::reinterpret_borrow<py::object>(e[2]);
      v.sizes_obj = py::reinterpret_borrow<py::object>(e[4]);
      v.strides_obj = py::reinterpret_borrow<py::object>(e[5]);
      views_.push_back(std::move(v));
    }
  }

  // bases[memory id]: (the buffer's tensor, its untyped storage as Python holds it), or
  // None. Puts each view in values[slot] and appends (view, storage, offset, sizes,
  // strides) to made, the entries a failed call's restore gives back.
  void make(const py::list& bases, py::list values, py::list made) const {
    std::vector<std::optional<at::Tensor>> tensors(bases.size());
    std::vector<py::object> storages(bases.size());
    for (size_t k = 0; k < bases.size(); ++k) {
      if (bases[k].is_none()) continue;
      auto pair = bases[k].cast<py::tuple>();
      tensors[k] = pair[0].cast<at::Tensor>();
      storages[k] = py::reinterpret_borrow<py::object>(pair[1]);
    }
    for (const auto& v : views_) {
      if (v.memory_id >= tensors.size() || !tensors[v.memory_id].has_value()) {
        throw std::out_of_range("a view of a buffer that was not given");
      }
      const at::Tensor& base = *tensors[v.memory_id];
      if (!base.device().is_cpu() || base.layout() != at::kStrided) {
        throw std::invalid_argument("views are made of CPU buffers");
      }
      const c10::Storage& storage = base.storage();
      if (v.bytes > storage.nbytes()) {
        throw std::out_of_range("a view reaching past its buffer");
      }
      // what new() then set_(storage, offset, sizes, strides) make, without the dispatch
      auto impl = c10::make_intrusive<c10::TensorImpl>(
          c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
          c10::scalarTypeToTypeMeta(v.dtype));
      impl->set_sizes_and_strides(v.sizes, v.strides, v.offset);
      impl->bump_version();  // (as set_ does)
      py::object obj = py::cast(at::Tensor(std::move(impl)));
      values[v.slot] = obj;
      made.append(py::make_tuple(obj, storages[v.memory_id], v.offset_obj, v.sizes_obj,
                                 v.strides_obj));
    }
  }

  size_t size() const { return views_.size(); }

 private:
  struct View;

  // The bytes of its buffer that view `v` reaches (none for no elements); refuses
  // negative or mismatched geometry and sizes whose extent overflows.
  static size_t extent(const View& v) {
    if (v.sizes.size() != v.strides.size()) {
      throw std::invalid_argument("a view whose strides are not one per size");
    }
    if (v.offset < 0) throw std::invalid_argument("a view at a negative offset");
    int64_t last = v.offset;
    for (size_t d = 0; d < v.sizes.size(); ++d) {
      if (v.sizes[d] < 0 || v.strides[d] < 0) {
        throw std::invalid_argument("a view of negative sizes or strides");
      }
      if (v.sizes[d] == 0) return 0;
    }
    for (size_t d = 0; d < v.sizes.size(); ++d) {
      int64_t step = 0;
      if (__builtin_mul_overflow(v.sizes[d] - 1, v.strides[d], &step) ||
          __builtin_add_overflow(last, step, &last)) {
        throw std::invalid_argument("a view whose extent overflows");
      }
    }
    int64_t count = 0, bytes = 0;
    if (__builtin_add_overflow(last, int64_t{1}, &count) ||
        __builtin_mul_overflow(count, static_cast<int64_t>(c10::elementSize(v.dtype)),
                               &bytes)) {
      throw std::invalid_argument("a view whose extent overflows");
    }
    return static_cast<size_t>(bytes);
  }

  struct View {
    size_t slot;
    size_t memory_id;
    int64_t offset;
    c10::ScalarType dtype;
    std::vector<int64_t> sizes, strides;
    size_t bytes;
    py::object offset_obj, sizes_obj, strides_obj;
  };
  std::vector<View> views_;
};

}  // namespace

PYBIND11_MODULE(ptexec_steps, m) {
  m.doc() =
      "Runs of prepared boxed calls of torch's operators, planned views, the fast call's "
      "input checks and copies, and output copies (ptexec.native).";
  py::class_<Steps>(m, "Steps")
      .def(py::init<>())
      .def("add", &Steps::add, py::arg("name"), py::arg("overload"), py::arg("args"),
           py::arg("empties"), py::arg("always"), py::arg("places"), py::arg("empty_slots"),
           py::arg("always_slots"))
      .def("bind", &Steps::bind, py::arg("values"))
      .def("__len__", &Steps::size)
      .def("run", &Steps::run, py::arg("empty"), py::call_guard<py::gil_scoped_release>())
      .def("stopped", &Steps::stopped, py::arg("k"));
  m.def("copies", &copies, py::arg("tensors"));
  py::class_<Guard>(m, "Guard")
      .def(py::init<const py::list&, const std::vector<std::pair<uintptr_t, uintptr_t>>&>(),
           py::arg("entries"), py::arg("ranges"))
      .def("function", &Guard::function)
      .def("__len__", &Guard::size);
  py::class_<Puts>(m, "Puts")
      .def(py::init<const std::vector<std::tuple<size_t, uintptr_t, size_t, bool>>&>(),
           py::arg("entries"))
      .def("function", &Puts::function)
      .def("__len__", &Puts::size);
  py::class_<Views>(m, "Views")
      .def(py::init<const py::list&>(), py::arg("entries"))
      .def("make", &Views::make, py::arg("bases"), py::arg("values"), py::arg("made"))
      .def("__len__", &Views::size);
}
