// Captured CUDA graphs and their executable instances.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "context.h"
#include "cuda_api.h"

namespace pgk {

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
  std::shared_ptr<GraphExec> instantiate() const;
  CUgraph handle() const { return graph_; }

 private:
  std::shared_ptr<Context> ctx_;
  CUgraph graph_;
};

void register_graphs(pybind11::module_& m);

}  // namespace pgk
