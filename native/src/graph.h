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
void replace_function(CUfunction old_fn, CUfunction new_fn);
// Applies the replacements an instance waits for (before it launches); a CUresult.
int apply_replacements(CUgraphExec exec);

void register_graphs(pybind11::module_& m);

}  // namespace pgk
