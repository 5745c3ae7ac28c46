#include "driver_bindings.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "context.h"
#include "driver.h"
#include "errors.h"
#include "stream.h"

namespace py = pybind11;

namespace pgk {
namespace {

void check_ordinal_pair(int a, int b) {
  int count = device_count();
  for (int ordinal : {a, b}) {
    if (ordinal < 0 || ordinal >= count) {
      throw CudaError("peer", cu::kErrorInvalidValue,
                      "device " + std::to_string(ordinal) + " out of range (" +
                          std::to_string(count) + " devices)");
    }
  }
}

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

bool can_access_peer(int device, int peer) {
  check_ordinal_pair(device, peer);
  const cu::DriverApi& api = driver();
  CUdevice a = 0, b = 0;
  check_cu(api.cuDeviceGet(&a, device), "cuDeviceGet");
  check_cu(api.cuDeviceGet(&b, peer), "cuDeviceGet");
  int ok = 0;
  check_cu(api.cuDeviceCanAccessPeer(&ok, a, b), "cuDeviceCanAccessPeer");
  return ok != 0;
}

// Lets `device`'s context read and write `peer`'s memory directly (once per pair; the
// driver keeps it for the contexts' lifetime).
void enable_peer_access(int device, int peer) {
  check_ordinal_pair(device, peer);
  auto peer_ctx = context_at(peer);
  auto ctx = context_at(device);
  ctx->make_current();
  CUresult r = driver().cuCtxEnablePeerAccess(peer_ctx->handle(), 0);
  current_context();  // back to this thread's own device
  if (r != cu::kErrorPeerAccessAlreadyEnabled) check_cu(r, "cuCtxEnablePeerAccess");
}

// nbytes from `src` on src_device to `dst` on dst_device, ordered on `stream` (a stream of
// dst_device's context, or its legacy stream); peer to peer when access is enabled, else
// the driver stages it through the host. sync: wait for it.
void memcpy_peer(uint64_t dst, int dst_device, uint64_t src, int src_device, size_t nbytes,
                 py::handle stream, bool sync) {
  check_ordinal_pair(dst_device, src_device);
  auto dst_ctx = context_at(dst_device);
  auto src_ctx = context_at(src_device);
  if (nbytes == 0) return;
  CUstream s = stream_handle(stream);
  check_cu(driver().cuMemcpyPeerAsync(dst, dst_ctx->handle(), src, src_ctx->handle(), nbytes, s),
           "cuMemcpyPeerAsync");
  if (sync) {
    py::gil_scoped_release nogil;
    check_cu(driver().cuStreamSynchronize(s), "cuStreamSynchronize");
  }
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
  m.def("get_device", &get_device,
        "The device this thread uses: its use_device choice, else the process's.");
  m.def("use_device", &use_device, py::arg("device"),
        "Select this thread's device (-1: the process's again); retains its primary context.");
  m.def("device_can_access_peer", &can_access_peer, py::arg("device"), py::arg("peer"),
        "Whether `device` can read and write `peer`'s memory directly (cuDeviceCanAccessPeer).");
  m.def("enable_peer_access", &enable_peer_access, py::arg("device"), py::arg("peer"),
        "Let `device`'s context reach `peer`'s memory directly (idempotent).");
  m.def("memcpy_peer", &memcpy_peer, py::arg("dst"), py::arg("dst_device"), py::arg("src"),
        py::arg("src_device"), py::arg("nbytes"), py::arg("stream") = py::none(),
        py::arg("sync") = true,
        "Copy nbytes between two devices' memory on `stream` (cuMemcpyPeerAsync); waits "
        "for it unless sync=False.");
  m.def("device_info", &device_info, py::arg("device") = py::none(),
        "Name, compute capability, SM count, memory and limits of a device.");
}

}  // namespace pgk
