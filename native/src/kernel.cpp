#include "kernel.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "capi_launch.h"
#include "driver.h"
#include "errors.h"
#include "graph.h"
#include "stream.h"

namespace py = pybind11;

namespace pgk {

Module::Module(const std::string& cubin) : ctx_(current_context()) {
  check_cu(driver().cuModuleLoadData(&module_, cubin.data()), "cuModuleLoadData");
}

Module::~Module() {
  const cu::DriverApi* api = driver_if_loaded();
  if (!api) return;
  CUcontext cur = nullptr;
  // cuModuleUnload works on the current context, which may be another device's by now.
  if (api->cuCtxGetCurrent(&cur) == cu::kSuccess && cur != ctx_->handle()) {
    api->cuCtxSetCurrent(ctx_->handle());
  }
  api->cuModuleUnload(module_);
}

Function::Function(std::shared_ptr<Module> module, const std::string& name)
    : module_(std::move(module)), name_(name) {
  check_cu(driver().cuModuleGetFunction(&func_, module_->handle(), name.c_str()),
           ("cuModuleGetFunction('" + name + "')").c_str());
  note_own_function(func_);
}

int Function::attribute(int attr) const {
  int v = 0;
  check_cu(driver().cuFuncGetAttribute(&v, attr, func_), "cuFuncGetAttribute");
  return v;
}

void Function::set_max_dynamic_shared_memory(int bytes) const {
  check_cu(driver().cuFuncSetAttribute(func_, cu::kFuncMaxDynamicSharedSizeBytes, bytes),
           "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
}

void Function::mark_provisional() const { note_provisional(func_); }

void Function::replace_with(const Function& better) {
  if (better.func_ == func_) return;
  if (better.module_->context() != module_->context()) {
    throw py::value_error("kernel '" + name_ + "': replace_with needs a function of the same "
                          "context");
  }
  int limit = attribute(cu::kFuncMaxDynamicSharedSizeBytes);
  if (limit > better.attribute(cu::kFuncMaxDynamicSharedSizeBytes)) {
    better.set_max_dynamic_shared_memory(limit);
  }
  replace_function(func_, better.func_);
  retired_.push_back(module_);
  module_ = better.module_;
  func_ = better.func_;
}

namespace {

union Slot {
  uint64_t u64;
  int64_t i64;
  int32_t i32;
  uint32_t u32;
  float f32;
  double f64;
};

// Up to this many parameters live on the stack; more falls back to the heap.
constexpr size_t kInlineArgs = 24;
// Tensor maps (format 'T', 128 bytes each) a launch may pass.
constexpr size_t kMaxTensorMaps = 4;

[[noreturn]] void arg_error(const std::string& kernel, size_t i, char code, py::handle value,
                            const char* expected) {
  PyErr_Clear();
  throw py::type_error("kernel '" + kernel + "' argument " + std::to_string(i) + " (fmt '" +
                       std::string(1, code) + "'): expected " + expected + ", got " +
                       std::string(py::str(py::repr(value))));
}

// A tensor map argument: the 128 bytes tensor_map_tiled returned, copied into `map`.
void pack_tensor_map(const std::string& kernel, size_t i, PyObject* v, cu::TensorMap& map) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (!PyBytes_Check(v) || PyBytes_AsStringAndSize(v, &data, &size) != 0 ||
      size != static_cast<Py_ssize_t>(sizeof(map.bytes))) {
    arg_error(kernel, i, 'T', py::handle(v), "a tensor map (128 bytes from tensor_map_tiled)");
  }
  std::memcpy(map.bytes, data, sizeof(map.bytes));
}

void pack(const std::string& kernel, char code, size_t i, PyObject* v, Slot& slot) {
  py::handle h(v);
  // bool is an int subclass, but passing True as a pointer or count is always a bug.
  bool is_int = PyLong_Check(v) && !PyBool_Check(v);
  switch (code) {
    case 'P':
      if (!is_int) arg_error(kernel, i, code, h, "a device pointer (int)");
      slot.u64 = PyLong_AsUnsignedLongLong(v);
      if (PyErr_Occurred()) arg_error(kernel, i, code, h, "a device pointer in [0, 2**64)");
      return;
    case 'i': {
      if (!is_int) arg_error(kernel, i, code, h, "an int32");
      long long x = PyLong_AsLongLong(v);
      if (PyErr_Occurred() || x < INT32_MIN || x > INT32_MAX) {
        arg_error(kernel, i, code, h, "an int32 in range");
      }
      slot.i32 = static_cast<int32_t>(x);
      return;
    }
    case 'I': {
      if (!is_int) arg_error(kernel, i, code, h, "a uint32");
      unsigned long long x = PyLong_AsUnsignedLongLong(v);
      if (PyErr_Occurred() || x > UINT32_MAX) arg_error(kernel, i, code, h, "a uint32 in range");
      slot.u32 = static_cast<uint32_t>(x);
      return;
    }
    case 'q':
      if (!is_int) arg_error(kernel, i, code, h, "an int64");
      slot.i64 = PyLong_AsLongLong(v);
      if (PyErr_Occurred()) arg_error(kernel, i, code, h, "an int64 in range");
      return;
    case 'f':
    case 'd': {
      if (!PyFloat_Check(v) && !is_int) arg_error(kernel, i, code, h, "a float");
      double x = PyFloat_AsDouble(v);
      if (PyErr_Occurred()) arg_error(kernel, i, code, h, "a float");
      if (code == 'f') {
        slot.f32 = static_cast<float>(x);
      } else {
        slot.f64 = x;
      }
      return;
    }
    default:
      throw py::type_error("kernel '" + kernel + "': unknown format char '" + std::string(1, code) +
                           "' at position " + std::to_string(i) + " (use P i I q f d T)");
  }
}

// Accepts an int or a tuple of 1-3 ints; missing dimensions are 1.
std::array<unsigned, 3> dims(const std::string& kernel, const char* what, py::handle obj) {
  std::array<unsigned, 3> d{1, 1, 1};
  auto one = [&](py::handle v) -> unsigned {
    if (!PyLong_Check(v.ptr())) {
      throw py::type_error("kernel '" + kernel + "': " + what + " must hold ints");
    }
    long long x = PyLong_AsLongLong(v.ptr());
    if (PyErr_Occurred() || x < 1 || x > UINT32_MAX) {
      PyErr_Clear();
      throw py::value_error("kernel '" + kernel + "': " + what + " dimensions must be >= 1");
    }
    return static_cast<unsigned>(x);
  };
  if (PyTuple_Check(obj.ptr())) {
    Py_ssize_t n = PyTuple_GET_SIZE(obj.ptr());
    if (n < 1 || n > 3) {
      throw py::type_error("kernel '" + kernel + "': " + what + " must have 1 to 3 dimensions");
    }
    for (Py_ssize_t k = 0; k < n; ++k) d[k] = one(PyTuple_GET_ITEM(obj.ptr(), k));
  } else {
    d[0] = one(obj);
  }
  return d;
}

}  // namespace

void Function::launch(py::handle grid, py::handle block, const std::string& fmt, py::handle args,
                      unsigned shared_mem, py::handle stream, bool pdl) const {
  if (!PyTuple_Check(args.ptr())) {
    throw py::type_error("kernel '" + name_ + "': args must be a tuple");
  }
  size_t n = fmt.size();
  size_t nargs = static_cast<size_t>(PyTuple_GET_SIZE(args.ptr()));
  if (nargs != n) {
    throw py::type_error("kernel '" + name_ + "' takes " + std::to_string(n) + " arguments (fmt '" +
                         fmt + "'), got " + std::to_string(nargs));
  }
  std::array<unsigned, 3> g = dims(name_, "grid", grid);
  std::array<unsigned, 3> b = dims(name_, "block", block);
  CUstream s = stream_handle(stream);

  std::array<Slot, kInlineArgs> slots_inline;
  std::array<void*, kInlineArgs> ptrs_inline;
  std::vector<Slot> slots_heap;
  std::vector<void*> ptrs_heap;
  Slot* slots = slots_inline.data();
  void** ptrs = ptrs_inline.data();
  if (n > kInlineArgs) {
    slots_heap.resize(n);
    ptrs_heap.resize(n);
    slots = slots_heap.data();
    ptrs = ptrs_heap.data();
  }
  std::array<cu::TensorMap, kMaxTensorMaps> maps;
  size_t n_maps = 0;
  for (size_t i = 0; i < n; ++i) {
    PyObject* v = PyTuple_GET_ITEM(args.ptr(), i);
    if (fmt[i] == 'T') {
      if (n_maps == kMaxTensorMaps) {
        throw py::type_error("kernel '" + name_ + "': more than " + std::to_string(kMaxTensorMaps) +
                             " tensor maps");
      }
      pack_tensor_map(name_, i, v, maps[n_maps]);
      ptrs[i] = &maps[n_maps++];
      continue;
    }
    pack(name_, fmt[i], i, v, slots[i]);
    ptrs[i] = &slots[i];
  }
  module_->context()->make_current();
  if (pdl) {
    cu::LaunchAttribute attr{};
    attr.id = cu::kLaunchAttrProgrammaticStreamSerialization;
    attr.value = 1;
    cu::LaunchConfig cfg{g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, s, &attr, 1};
    check_cu(driver().cuLaunchKernelEx(&cfg, func_, n ? ptrs : nullptr, nullptr),
             ("cuLaunchKernelEx('" + name_ + "')").c_str());
    return;
  }
  check_cu(driver().cuLaunchKernel(func_, g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, s,
                                   n ? ptrs : nullptr, nullptr),
           ("cuLaunchKernel('" + name_ + "')").c_str());
}

void register_kernels(py::module_& m) {
  py::class_<Module, std::shared_ptr<Module>>(m, "Module", "A loaded CUBIN.")
      .def(py::init([](py::bytes cubin) { return std::make_shared<Module>(std::string(cubin)); }),
           py::arg("cubin"))
      .def("get_function", [](const std::shared_ptr<Module>& mod, const std::string& name) {
        return std::make_shared<Function>(mod, name);
      });

  auto attr = [](int a) { return [a](const Function& f) { return f.attribute(a); }; };
  py::class_<Function, std::shared_ptr<Function>>(m, "Function", "A kernel of a Module.")
      .def_property_readonly("name", &Function::name)
      .def_property_readonly("num_regs", attr(cu::kFuncNumRegs))
      .def_property_readonly("max_threads", attr(cu::kFuncMaxThreadsPerBlock))
      .def_property_readonly("shared_bytes", attr(cu::kFuncSharedSizeBytes))
      .def_property_readonly("const_bytes", attr(cu::kFuncConstSizeBytes))
      .def_property_readonly("local_bytes", attr(cu::kFuncLocalSizeBytes))
      .def_property_readonly("max_dynamic_shared_memory", attr(cu::kFuncMaxDynamicSharedSizeBytes))
      .def("set_max_dynamic_shared_memory", &Function::set_max_dynamic_shared_memory,
           py::arg("bytes"))
      .def("mark_provisional", &Function::mark_provisional,
           "Loaded from a quickly compiled CUBIN: graphs instantiated from now on track the "
           "nodes that launch it, for replace_with.")
      .def("replace_with", &Function::replace_with, py::arg("better"),
           "Launch `better` (the same kernel, optimised) from now on: this Function's handle "
           "becomes its, and captured graphs launching this one move to it on their next "
           "launch.")
      .def_property_readonly(
          "handle", [](const Function& f) { return reinterpret_cast<uintptr_t>(f.handle()); })
      .def_property_readonly(
          "context_handle",
          [](const Function& f) { return reinterpret_cast<uintptr_t>(f.context_handle()); })
      .def(
          "launch",
          [](py::object self, py::handle grid, py::handle block, const std::string& fmt,
             py::handle args, unsigned shared_mem, py::handle stream, bool pdl) {
            self.cast<const Function&>().launch(grid, block, fmt, args, shared_mem, stream, pdl);
            if (PyObject* rec = launch_recorder()) {
              // Held: the recorder may unset itself (and drop its last reference) inside.
              py::object hold = py::reinterpret_borrow<py::object>(rec);
              hold(self, grid, block, fmt, args, shared_mem, pdl);
            }
          },
          py::arg("grid"), py::arg("block"), py::arg("fmt"), py::arg("args"),
          py::arg("shared_mem") = 0, py::arg("stream") = py::none(), py::arg("pdl") = false,
           "fmt: one char per kernel parameter: P pointer, i int32, I uint32, q int64, "
           "f float32, d float64, T tensor map (128 bytes, tensor_map_tiled). pdl: "
           "programmatic dependent launch (SM 9.0+; the kernel waits on the previous one "
           "with griddepcontrol.wait).");
}

}  // namespace pgk
