#include "graph.h"

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "driver.h"
#include "errors.h"
#include "stream.h"

namespace py = pybind11;

namespace pgk {
namespace {

// An instance whose kernel nodes launch provisional (or replaced) functions: those nodes,
// with the function each launches now, and the graph that owns the node handles.
struct Tracked {
  std::shared_ptr<Graph> graph;
  std::vector<std::pair<CUgraphNode, CUfunction>> nodes;
  bool waiting = false;  // a node's function has been replaced since it was last updated
};

struct Registry {
  std::mutex mu;
  std::unordered_set<CUfunction> own;     // every function this library loaded
  std::unordered_set<CUgraphNode> early;  // captured nodes marked by mark_capture_tail
  std::unordered_set<CUfunction> provisional;
  std::unordered_map<CUfunction, CUfunction> replaced;  // old -> its optimised build
  std::unordered_map<CUgraphExec, Tracked> execs;
};

// Leaked on purpose: instances may be destroyed during interpreter shutdown.
Registry& registry() {
  static auto* r = new Registry();
  return *r;
}

std::atomic<int> g_waiting{0};  // tracked instances with waiting set

CUfunction final_function(const Registry& r, CUfunction fn) {
  for (auto it = r.replaced.find(fn); it != r.replaced.end(); it = r.replaced.find(fn)) {
    fn = it->second;
  }
  return fn;
}

// Points each tracked node of `t` at its function's replacement; r.mu held.
int update_nodes(const Registry& r, CUgraphExec exec, Tracked& t) {
  const auto& api = driver();
  for (auto& [node, fn] : t.nodes) {
    CUfunction want = final_function(r, fn);
    if (want == fn) continue;
    cu::KernelNodeParams p{};
    int rc = api.cuGraphKernelNodeGetParams(node, &p);
    if (rc != cu::kSuccess) return rc;
    p.func = want;
    p.kern = nullptr;
    rc = api.cuGraphExecKernelNodeSetParams(exec, node, &p);
    if (rc != cu::kSuccess) return rc;
    fn = want;
  }
  return cu::kSuccess;
}

bool any_provisional(const Registry& r, const Tracked& t) {
  for (const auto& [node, fn] : t.nodes) {
    if (r.provisional.count(fn)) return true;
  }
  return false;
}

// Records the kernel nodes of a new instance that launch provisional or replaced functions,
// and updates the replaced ones at once.
void track(const std::shared_ptr<Graph>& graph, CUgraphExec exec) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.provisional.empty() && r.replaced.empty()) return;
  const auto& api = driver();
  size_t n = 0;
  check_cu(api.cuGraphGetNodes(graph->handle(), nullptr, &n), "cuGraphGetNodes");
  std::vector<CUgraphNode> nodes(n);
  if (n) check_cu(api.cuGraphGetNodes(graph->handle(), nodes.data(), &n), "cuGraphGetNodes");
  Tracked t{graph, {}, false};
  for (CUgraphNode node : nodes) {
    int type = -1;
    check_cu(api.cuGraphNodeGetType(node, &type), "cuGraphNodeGetType");
    if (type != cu::kGraphNodeTypeKernel) continue;
    cu::KernelNodeParams p{};
    check_cu(api.cuGraphKernelNodeGetParams(node, &p), "cuGraphKernelNodeGetParams");
    if (p.func && (r.provisional.count(p.func) || r.replaced.count(p.func))) {
      t.nodes.emplace_back(node, p.func);
    }
  }
  check_cu(update_nodes(r, exec, t), "cuGraphExecKernelNodeSetParams");
  if (any_provisional(r, t)) r.execs.emplace(exec, std::move(t));
}

void untrack(CUgraphExec exec) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.execs.find(exec);
  if (it == r.execs.end()) return;
  if (it->second.waiting) g_waiting.fetch_sub(1, std::memory_order_acq_rel);
  r.execs.erase(it);
}

}  // namespace

void note_own_function(CUfunction fn) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.own.insert(fn);
}

int mark_capture_tail(CUstream stream) {
  const cu::DriverApi& api = driver();
  if (!api.cuStreamGetCaptureInfo) return 0;
  int status = 0;
  const CUgraphNode* deps = nullptr;
  size_t n = 0;
  check_cu(api.cuStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &deps, nullptr, &n),
           "cuStreamGetCaptureInfo");
  if (status != 1 || deps == nullptr) return 0;  // 1: CU_STREAM_CAPTURE_STATUS_ACTIVE
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (size_t i = 0; i < n; ++i) r.early.insert(deps[i]);
  return static_cast<int>(n);
}

void note_provisional(CUfunction fn) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.provisional.insert(fn);
}

void replace_function(CUfunction old_fn, CUfunction new_fn) {
  if (old_fn == new_fn) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.provisional.erase(old_fn);
  r.replaced[old_fn] = new_fn;
  for (auto& [exec, t] : r.execs) {
    if (t.waiting) continue;
    for (const auto& [node, fn] : t.nodes) {
      if (fn == old_fn) {
        t.waiting = true;
        g_waiting.fetch_add(1, std::memory_order_acq_rel);
        break;
      }
    }
  }
}

int apply_replacements(CUgraphExec exec) {
  if (g_waiting.load(std::memory_order_acquire) == 0) return cu::kSuccess;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.execs.find(exec);
  if (it == r.execs.end() || !it->second.waiting) return cu::kSuccess;
  int rc = update_nodes(r, exec, it->second);
  if (rc != cu::kSuccess) return rc;
  g_waiting.fetch_sub(1, std::memory_order_acq_rel);
  it->second.waiting = false;
  if (!any_provisional(r, it->second)) r.execs.erase(it);  // nothing left to replace
  return cu::kSuccess;
}

GraphExec::~GraphExec() {
  if (const cu::DriverApi* api = driver_if_loaded()) {
    untrack(exec_);
    api->cuGraphExecDestroy(exec_);
  }
}

void GraphExec::launch(CUstream stream) const {
  check_cu(apply_replacements(exec_), "cuGraphExecKernelNodeSetParams");
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

int Graph::start_after_foreign_launch() {
  const cu::DriverApi& api = driver();
  if (!api.cuGraphGetEdges || !api.cuGraphAddDependencies || !api.cuGraphRemoveDependencies) {
    return 0;
  }
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.early.empty()) return 0;  // no GEMM was marked: nothing to move
  }
  size_t n = 0;
  check_cu(api.cuGraphGetEdges(graph_, nullptr, nullptr, nullptr, &n), "cuGraphGetEdges");
  if (n == 0) return 0;
  std::vector<CUgraphNode> from(n), to(n);
  std::vector<cu::EdgeData> data(n);
  check_cu(api.cuGraphGetEdges(graph_, from.data(), to.data(), data.data(), &n), "cuGraphGetEdges");
  // Whether `node` is a kernel node and launches one of this library's functions.
  auto kernel_of = [&](CUgraphNode node, bool& own) {
    int type = -1;
    check_cu(api.cuGraphNodeGetType(node, &type), "cuGraphNodeGetType");
    if (type != cu::kGraphNodeTypeKernel) return false;
    cu::KernelNodeParams p{};
    check_cu(api.cuGraphKernelNodeGetParams(node, &p), "cuGraphKernelNodeGetParams");
    std::lock_guard<std::mutex> lock(r.mu);
    own = p.func != nullptr && r.own.count(p.func) > 0;
    return true;
  };
  auto marked = [&](CUgraphNode node) {
    std::lock_guard<std::mutex> lock(r.mu);
    return r.early.count(node) > 0;
  };
  int changed = 0;
  for (size_t i = 0; i < n; ++i) {
    const cu::EdgeData& e = data[i];
    if (e.type != cu::kGraphDependencyProgrammatic || e.from_port != cu::kGraphPortProgrammatic) {
      continue;
    }
    bool up_own = true, down_own = false;
    if (!marked(from[i]) || !kernel_of(from[i], up_own) || up_own || !kernel_of(to[i], down_own) ||
        !down_own) {
      continue;
    }
    cu::EdgeData early = e;
    early.from_port = cu::kGraphPortLaunchOrder;
    check_cu(api.cuGraphRemoveDependencies(graph_, &from[i], &to[i], &e, 1),
             "cuGraphRemoveDependencies");
    check_cu(api.cuGraphAddDependencies(graph_, &from[i], &to[i], &early, 1),
             "cuGraphAddDependencies");
    ++changed;
  }
  std::lock_guard<std::mutex> lock(r.mu);  // the marks are this graph's: spent
  for (CUgraphNode node : from) r.early.erase(node);
  return changed;
}

std::shared_ptr<GraphExec> instantiate(const std::shared_ptr<Graph>& graph) {
  const std::shared_ptr<Context>& ctx = graph->context();
  ctx->make_current();
  CUgraphExec exec = nullptr;
  check_cu(driver().cuGraphInstantiateWithFlags(&exec, graph->handle(), 0),
           "cuGraphInstantiateWithFlags");
  auto out = std::make_shared<GraphExec>(ctx, exec);
  track(graph, exec);
  return out;
}

void register_graphs(py::module_& m) {
  py::class_<Graph, std::shared_ptr<Graph>>(m, "Graph", "A captured CUDA graph.")
      .def_property_readonly("num_nodes", &Graph::num_nodes)
      .def("start_after_foreign_launch", &Graph::start_after_foreign_launch,
           "Let each of our kernels that is the programmatic dependent of a kernel we did not "
           "build (cuBLASLt's, which never trigger early) and marked by "
           "graph_mark_capture_tail start once that kernel's blocks have all begun instead "
           "of exited; it still waits for it inside. Returns the edges changed (0 on "
           "drivers before CUDA 12.3). Call before instantiate.")
      .def("instantiate", &instantiate);
  m.def(
      "graph_mark_capture_tail",
      [](py::handle stream) { return mark_capture_tail(stream_handle(stream)); },
      py::arg("stream") = py::none(),
      "Mark the node(s) the stream's capture ends in (the launch just captured) so that "
      "Graph.start_after_foreign_launch lets our kernel after it start early; returns how "
      "many (0 when not capturing or on drivers before CUDA 12.3).");
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
