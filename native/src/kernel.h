// Loaded CUBIN modules, their kernels and launches with arguments packed from a format
// string (one char per kernel parameter).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "context.h"
#include "cuda_api.h"

namespace pgk {

class Module {
 public:
  explicit Module(const std::string& cubin);
  ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  CUmodule handle() const { return module_; }
  const std::shared_ptr<Context>& context() const { return ctx_; }

 private:
  std::shared_ptr<Context> ctx_;
  CUmodule module_ = nullptr;
};

class Function {
 public:
  Function(std::shared_ptr<Module> module, const std::string& name);

  const std::string& name() const { return name_; }
  // The raw CUfunction and CUcontext, for the launch C ABI (capi_launch.h); valid while this
  // Function (which keeps its module loaded) lives.
  CUfunction handle() const { return func_; }
  CUcontext context_handle() const { return module_->context()->handle(); }
  int attribute(int attr) const;
  void set_max_dynamic_shared_memory(int bytes) const;
  // Two-tier compiles (graph.h): marks this function as loaded from a quickly compiled,
  // less optimised CUBIN, so graphs instantiated from now on track the nodes launching it.
  void mark_provisional() const;
  // From now on this Function launches `better` (the same kernel, optimised; same context):
  // its handle becomes better's, the graph instances launching the old one move to it on
  // their next launch, its dynamic shared memory limit carries over. The old module stays
  // loaded (launches queued before may still run its code).
  void replace_with(const Function& better);
  // Packs `args` per `fmt` (P i I q f d) and calls cuLaunchKernel. TypeError names the kernel.
  // pdl: launch with programmatic stream serialization (the kernel must griddepcontrol.wait
  // before it reads what earlier work wrote, or writes what earlier work reads).
  void launch(pybind11::handle grid, pybind11::handle block, const std::string& fmt,
              pybind11::handle args, unsigned shared_mem, pybind11::handle stream,
              bool pdl) const;

 private:
  std::shared_ptr<Module> module_;  // the function is only valid while its module is loaded
  CUfunction func_ = nullptr;
  std::string name_;
  std::vector<std::shared_ptr<Module>> retired_;  // modules of functions replaced
};

void register_kernels(pybind11::module_& m);

}  // namespace pgk
