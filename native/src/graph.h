// Captured CUDA graphs and their executable instances.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "context.h"
#include "cuda_api.h"

namespace pgk {

class Graph;

class GraphExec {
 public:
  GraphExec(std::shared_ptr<Context> ctx, CUgraphExec exec) : ctx_(std::move(ctx)), exec_(exec) {}
  ~GraphExec();
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;

  void launch(CUstream stream) const;
  CUgraphExec handle() const { return exec_; }

 private:
  std::shared_ptr<Context> ctx_;
  CUgraphExec exec_;
};

class Graph {
 public:
  Graph(std::shared_ptr<Context> ctx, CUgraph graph) : ctx_(std::move(ctx)), graph_(graph) {}
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  size_t num_nodes() const;
  // Lets each kernel of ours that is the programmatic dependent of a kernel we did not build
  // (cuBLASLt's) marked early (mark_capture_tail) start once that kernel's blocks have all
  // begun, rather than once they have all exited (they never trigger early): its blocks are
  // then resident and waiting (griddepcontrol.wait still waits for the whole kernel and its
  // writes) when it ends. Returns the edges changed (0 where the driver predates CUDA 12.3).
  // Call before instantiate.
  int start_after_foreign_launch();
  CUgraph handle() const { return graph_; }
  const std::shared_ptr<Context>& context() const { return ctx_; }

 private:
  std::shared_ptr<Context> ctx_;
  CUgraph graph_;
};

// Instantiates `graph`; an instance holding provisional functions keeps the graph (its kernel
// nodes name what to update when they are replaced).
std::shared_ptr<GraphExec> instantiate(const std::shared_ptr<Graph>& graph);

// Two-tier compiles: a kernel first loaded from a quickly compiled (less optimised) CUBIN is
// provisional; when its optimised build is loaded, replace_function(old, new) records that,
// and each instance whose kernel nodes launch `old` is updated to launch `new` on its next
// launch (by the thread launching it, so never while another thread launches it), through
// cuGraphExecKernelNodeSetParams: the instance, its handle and its other nodes stay as they
// are. Until any instance waits for an update, a launch pays one atomic load.
void note_provisional(CUfunction fn);
// Records a function this library loaded (its kernels open with griddepcontrol.wait when
// launched as programmatic dependents): kernel nodes launching any other are foreign.
void note_own_function(CUfunction fn);
// Marks the nodes `stream`'s capture would make the next node depend on (the last launch
// captured) for Graph::start_after_foreign_launch; returns how many (0 when not capturing
// or the driver predates CUDA 12.3).
int mark_capture_tail(CUstream stream);
void replace_function(CUfunction old_fn, CUfunction new_fn);
// Applies the replacements an instance waits for (before it launches); a CUresult.
int apply_replacements(CUgraphExec exec);

void register_graphs(pybind11::module_& m);

}  // namespace pgk
