// Primary context per device (retained once, released when the last user lets go), the
// process-wide selected device and a thread's own choice over it (use_device).
#pragma once

#include <memory>

#include "cuda_api.h"

namespace pgk {

class Context {
 public:
  explicit Context(int ordinal);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int ordinal() const { return ordinal_; }
  CUdevice device() const { return device_; }
  CUcontext handle() const { return ctx_; }

  // Cheap when already current (one TLS read in the driver), so every entry point calls it:
  // other libraries on the same thread may have switched the current context.
  void make_current() const;

 private:
  int ordinal_;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
};

// The selected device's context, retained on first use and made current on this thread.
std::shared_ptr<Context> current_context();

// Device `ordinal`'s context, retained on first use; not made current.
std::shared_ptr<Context> context_at(int ordinal);

// The process's device (every thread that has not chosen its own).
void set_device(int ordinal);
// This thread's device (gpk.Device blocks); -1 goes back to the process's.
void use_device(int ordinal);
// The device this thread uses: its own choice, else the process's.
int get_device();
int device_count();

}  // namespace pgk
