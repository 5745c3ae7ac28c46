#include "graph.h"

#include "driver.h"
#include "errors.h"
#include "stream.h"

namespace py = pybind11;

namespace pgk {

GraphExec::~GraphExec() {
  if (const cu::DriverApi* api = driver_if_loaded()) api->cuGraphExecDestroy(exec_);
}

void GraphExec::launch(CUstream stream) const {
  check_cu(driver().cuGraphLaunch(exec_, stream), "cuGraphLaunch");
}

Graph::~Graph() {
  if (const cu::DriverApi* api = driver_if_loaded()) api->cuGraphDestroy(graph_);
}

size_t Graph::num_nodes() const {
  size_t n = 0;
  check_cu(driver().cuGraphGetNodes(graph_, nullptr, &n), "cuGraphGetNodes");
  return n;
}

std::shared_ptr<GraphExec> Graph::instantiate() const {
  ctx_->make_current();
  CUgraphExec exec = nullptr;
  check_cu(driver().cuGraphInstantiateWithFlags(&exec, graph_, 0), "cuGraphInstantiateWithFlags");
  return std::make_shared<GraphExec>(ctx_, exec);
}

void register_graphs(py::module_& m) {
  py::class_<Graph, std::shared_ptr<Graph>>(m, "Graph", "A captured CUDA graph.")
      .def_property_readonly("num_nodes", &Graph::num_nodes)
      .def("instantiate", &Graph::instantiate);
  py::class_<GraphExec, std::shared_ptr<GraphExec>>(m, "GraphExec",
                                                    "An instantiated graph, ready to replay.")
      .def(
          "launch", [](const GraphExec& g, py::handle stream) { g.launch(stream_handle(stream)); },
          py::arg("stream") = py::none())
      .def_property_readonly(
          "handle", [](const GraphExec& g) { return reinterpret_cast<uintptr_t>(g.handle()); },
          "The CUgraphExec: the launch C ABI's graph_launch takes it (a compiled call's quick "
          "hit launches without a Python frame).");
}

}  // namespace pgk
