#include "dlpack.h"

#include <Python.h>

#include <cstdint>

namespace py = pybind11;

namespace pgk {
namespace {

// The head of DLPack's DLManagedTensor (dlpack.h, ABI v0.8+): the capsule's pointer. Only
// the deleter is read here; the layout before it is DLTensor's.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

// A capsule still named "dltensor" was never consumed: it owns its tensor and calls the
// deleter (the DLPack contract). A consumed one was renamed "used_dltensor": nothing to do.
// The deleter is Python (interop.py), so any exception in flight is set aside around it.
extern "C" void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) {
    return;
  }
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed != nullptr && managed->deleter != nullptr) {
    managed->deleter(managed);
  }
  PyErr_Clear();  // the deleter reports its own errors; the consumer's exception wins
  PyErr_Restore(type, value, traceback);
}

}  // namespace

void register_dlpack(py::module_& m) {
  m.def(
      "dlpack_capsule_destructor",
      []() { return reinterpret_cast<uintptr_t>(&capsule_destructor); },
      "Address of the C destructor for exported 'dltensor' capsules (calls the deleter of "
      "an unconsumed one, keeping any exception in flight).");
}

}  // namespace pgk
