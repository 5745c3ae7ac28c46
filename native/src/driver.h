// Loading libcuda at run time and resolving its entry points through cuGetProcAddress.
#pragma once

#include <string>

#include "cuda_api.h"

namespace pgk {

// Loads libcuda.so.1, resolves every entry point and calls cuInit(0) once. Throws CudaError
// (code -1 when the library or an entry point is missing) and keeps throwing the same
// error on later calls, so a missing driver is reported, never crashes.
const cu::DriverApi& driver();

// The table if driver() already succeeded, else nullptr; never loads or throws.
const cu::DriverApi* driver_if_loaded();

// Empty when the driver loaded and has a device, else why not. Never throws.
std::string driver_unavailable_reason();

}  // namespace pgk
