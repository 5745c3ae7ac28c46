#include "driver_bindings.h"

#include <pybind11/stl.h>

#include <string>

#include "context.h"
#include "driver.h"
#include "errors.h"

namespace py = pybind11;

namespace pgk {
namespace {

int attribute(int attr, CUdevice dev) {
  int v = 0;
  check_cu(driver().cuDeviceGetAttribute(&v, attr, dev), "cuDeviceGetAttribute");
  return v;
}

py::dict device_info(py::object device) {
  int ordinal = device.is_none() ? get_device() : device.cast<int>();
  int count = device_count();
  if (ordinal < 0 || ordinal >= count) {
    throw CudaError("device_info", cu::kErrorInvalidValue,
                    "device " + std::to_string(ordinal) + " out of range (" +
                        std::to_string(count) + " devices)");
  }
  const cu::DriverApi& api = driver();
  CUdevice dev = 0;
  check_cu(api.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  char name[256] = {0};
  check_cu(api.cuDeviceGetName(name, sizeof(name) - 1, dev), "cuDeviceGetName");
  size_t total = 0;
  check_cu(api.cuDeviceTotalMem(&total, dev), "cuDeviceTotalMem");
  py::dict d;
  d["ordinal"] = ordinal;
  d["name"] = std::string(name);
  d["compute_capability"] = py::make_tuple(attribute(cu::kAttrComputeCapabilityMajor, dev),
                                           attribute(cu::kAttrComputeCapabilityMinor, dev));
  d["sm_count"] = attribute(cu::kAttrMultiprocessorCount, dev);
  d["total_memory"] = total;
  d["max_threads_per_block"] = attribute(cu::kAttrMaxThreadsPerBlock, dev);
  d["warp_size"] = attribute(cu::kAttrWarpSize, dev);
  d["max_shared_per_block_optin"] = attribute(cu::kAttrMaxSharedPerBlockOptin, dev);
  d["max_shared_per_sm"] = attribute(cu::kAttrMaxSharedPerMultiprocessor, dev);
  d["l2_cache_bytes"] = attribute(cu::kAttrL2CacheSize, dev);
  d["clock_khz"] = attribute(cu::kAttrClockRate, dev);
  d["pci_bus_id"] = attribute(cu::kAttrPciBusId, dev);
  return d;
}

}  // namespace

void register_driver(py::module_& m) {
  m.def(
      "driver_available", []() { return driver_unavailable_reason().empty(); },
      "True when libcuda loads, initialises and has a device. Never raises.");
  m.def("driver_unavailable_reason", &driver_unavailable_reason,
        "Why driver_available() is False ('' when it is True). Never raises.");
  m.def(
      "driver_version",
      []() {
        int v = 0;
        check_cu(driver().cuDriverGetVersion(&v), "cuDriverGetVersion");
        return v;
      },
      "CUDA version the driver supports, e.g. 13000.");
  m.def("device_count", &device_count, "Number of CUDA devices (0 when none).");
  m.def("set_device", &set_device, py::arg("device"),
        "Select the device later calls use; retains its primary context.");
  m.def("get_device", &get_device);
  m.def("device_info", &device_info, py::arg("device") = py::none(),
        "Name, compute capability, SM count, memory and limits of a device.");
}

}  // namespace pgk
