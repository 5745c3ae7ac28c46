#include "context.h"

#include <mutex>
#include <string>
#include <vector>

#include "driver.h"
#include "errors.h"

namespace pgk {
namespace {

std::mutex g_mu;
int g_device = 0;
// A thread inside a gpk.Device block works on that device while others keep theirs (the
// driver's current context is per thread too); -1: the process's device.
thread_local int t_device = -1;

void check_ordinal(const char* what, int ordinal) {
  int count = device_count();
  if (ordinal < 0 || ordinal >= count) {
    throw CudaError(what, cu::kErrorInvalidValue,
                    "device " + std::to_string(ordinal) + " out of range (" +
                        std::to_string(count) + " devices)");
  }
}

// Leaked on purpose: objects still alive at interpreter exit hold their own shared_ptr, and
// a static destructor here would race the driver's own teardown for no benefit.
std::vector<std::shared_ptr<Context>>& contexts() {
  static auto* v = new std::vector<std::shared_ptr<Context>>();
  return *v;
}

}  // namespace

Context::Context(int ordinal) : ordinal_(ordinal) {
  const cu::DriverApi& api = driver();
  check_cu(api.cuDeviceGet(&device_, ordinal), "cuDeviceGet");
  check_cu(api.cuDevicePrimaryCtxRetain(&ctx_, device_), "cuDevicePrimaryCtxRetain");
}

Context::~Context() {
  if (const cu::DriverApi* api = driver_if_loaded()) api->cuDevicePrimaryCtxRelease(device_);
}

void Context::make_current() const {
  const cu::DriverApi& api = driver();
  CUcontext cur = nullptr;
  if (api.cuCtxGetCurrent(&cur) == cu::kSuccess && cur == ctx_) return;
  check_cu(api.cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
}

int device_count() {
  int count = 0;
  CUresult r = driver().cuDeviceGetCount(&count);
  if (r == cu::kErrorNoDevice) return 0;
  check_cu(r, "cuDeviceGetCount");
  return count;
}

std::shared_ptr<Context> context_at(int ordinal) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& v = contexts();
  if (v.size() <= static_cast<size_t>(ordinal)) v.resize(ordinal + 1);
  if (!v[ordinal]) v[ordinal] = std::make_shared<Context>(ordinal);
  return v[ordinal];
}

std::shared_ptr<Context> current_context() {
  std::shared_ptr<Context> ctx = context_at(get_device());
  ctx->make_current();
  return ctx;
}

void set_device(int ordinal) {
  check_ordinal("set_device", ordinal);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_device = ordinal;
  }
  current_context();
}

void use_device(int ordinal) {
  if (ordinal != -1) check_ordinal("use_device", ordinal);
  t_device = ordinal;
  current_context();
}

int get_device() {
  if (t_device >= 0) return t_device;
  std::lock_guard<std::mutex> lock(g_mu);
  return g_device;
}

}  // namespace pgk
