#include "cublaslt.h"

#include <dlfcn.h>
#include <pybind11/stl.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <tuple>

#include "context.h"
#include "driver.h"
#include "dynlib.h"
#include "errors.h"
#include "stream.h"

namespace py = pybind11;

namespace pgk {
namespace {

// -- our declarations of the cuBLASLt subset (values from cublasLt.h / cublas_api.h /
// library_types.h; all ABI-stable) --------------------------------------------------------
using cublasStatus = int;
typedef struct cublasLtContext* LtHandle;
typedef struct cublasLtMatmulDescOpaque* LtDesc;
typedef struct cublasLtMatrixLayoutOpaque* LtLayout;
typedef struct cublasLtMatmulPreferenceOpaque* LtPref;
struct LtAlgo {
  uint64_t data[8];
};
struct LtHeuristic {
  LtAlgo algo;
  size_t workspace_size;
  cublasStatus state;
  float waves_count;
  int reserved[4];
};

constexpr cublasStatus kLtSuccess = 0;
constexpr cublasStatus kLtNotSupported = 15;
constexpr int kR32F = 0, kR16F = 2, kR16BF = 14, kR8FE4M3 = 28;  // cudaDataType
constexpr int kCompute32F = 68, kCompute32FFastTF32 = 77;        // cublasComputeType_t
constexpr int kOpN = 0, kOpT = 1;                                // cublasOperation_t
constexpr int kDescTransA = 3, kDescTransB = 4, kDescEpilogue = 7, kDescBiasPointer = 8;
constexpr int kDescAScalePointer = 17, kDescBScalePointer = 18;
constexpr int kDescAScaleMode = 31, kDescBScaleMode = 32;
constexpr int kLayoutBatchCount = 5, kLayoutStridedBatchOffset = 6;
constexpr int kPrefMaxWorkspace = 1;
constexpr int kPrefMinAlignA = 5, kPrefMinAlignB = 6, kPrefMinAlignC = 7, kPrefMinAlignD = 8;

// Epilogue names as the Python side spells them, with their cublasLtEpilogue_t values.
constexpr const char* kEpilogueNames[] = {"none", "bias", "gelu", "gelu_bias"};
constexpr uint32_t kEpilogueValues[] = {1, 4, 32, 36};
constexpr int kNumEpilogues = 4;
bool epilogue_has_bias(int e) { return e == 1 || e == 3; }

// FP8 scale modes as the Python side spells them, with their cublasLtMatmulMatrixScale_t
// values: one scale, one per row (of A [M, K] or of the stored B [N, K]), one per 128
// elements of a row, one per 128 x 128 block of B.
struct ScaleMode {
  const char* name;
  int value;
  bool for_a, for_b;
};
constexpr ScaleMode kScaleModes[] = {{"scalar", 0, true, true},
                                     {"outer_vec", 3, true, true},
                                     {"vec128", 4, true, true},
                                     {"blk128x128", 5, false, true}};
const char* scale_name(int value) {
  for (const ScaleMode& s : kScaleModes) {
    if (s.value == value) return s.name;
  }
  return "none";
}

#define PGK_LT_ENTRY_POINTS(X)                                                                   \
  X(cublasLtCreate, cublasStatus, (LtHandle*))                                                   \
  X(cublasLtGetVersion, size_t, ())                                                              \
  X(cublasLtMatmulDescCreate, cublasStatus, (LtDesc*, int, int))                                 \
  X(cublasLtMatmulDescDestroy, cublasStatus, (LtDesc))                                           \
  X(cublasLtMatmulDescSetAttribute, cublasStatus, (LtDesc, int, const void*, size_t))            \
  X(cublasLtMatrixLayoutCreate, cublasStatus, (LtLayout*, int, uint64_t, uint64_t, int64_t))     \
  X(cublasLtMatrixLayoutDestroy, cublasStatus, (LtLayout))                                       \
  X(cublasLtMatrixLayoutSetAttribute, cublasStatus, (LtLayout, int, const void*, size_t))        \
  X(cublasLtMatmulPreferenceCreate, cublasStatus, (LtPref*))                                     \
  X(cublasLtMatmulPreferenceDestroy, cublasStatus, (LtPref))                                     \
  X(cublasLtMatmulPreferenceSetAttribute, cublasStatus, (LtPref, int, const void*, size_t))      \
  X(cublasLtMatmulAlgoGetHeuristic, cublasStatus,                                                \
    (LtHandle, LtDesc, LtLayout, LtLayout, LtLayout, LtLayout, LtPref, int, LtHeuristic*, int*)) \
  X(cublasLtMatmul, cublasStatus,                                                                \
    (LtHandle, LtDesc, const void*, const void*, LtLayout, const void*, LtLayout, const void*,   \
     const void*, LtLayout, void*, LtLayout, const LtAlgo*, void*, size_t, CUstream))

struct LtApi {
#define PGK_DECLARE(name, ret, sig) ret(*name) sig = nullptr;
  PGK_LT_ENTRY_POINTS(PGK_DECLARE)
#undef PGK_DECLARE
  const char* (*cublasLtGetStatusName)(cublasStatus) = nullptr;
  const char* (*cublasLtGetStatusString)(cublasStatus) = nullptr;
};

std::mutex g_load_mu;
std::string g_path;
// Leaked on purpose, like NVRTC's: plans may be destroyed during interpreter shutdown.
LtApi* g_api_storage = new LtApi();
std::atomic<const LtApi*> g_api{nullptr};

const LtApi& api() {
  const LtApi* a = g_api.load(std::memory_order_acquire);
  if (!a) {
    throw CudaError("cublasLt", -1,
                    "cuBLASLt is not loaded; use pygpukit.backends.cuda.toolchain.load_cublaslt, "
                    "which finds and loads it");
  }
  return *a;
}

void check_lt(cublasStatus s, const char* call) {
  if (s == kLtSuccess) return;
  const LtApi& a = api();
  const char* name = a.cublasLtGetStatusName ? a.cublasLtGetStatusName(s) : nullptr;
  const char* text = a.cublasLtGetStatusString ? a.cublasLtGetStatusString(s) : nullptr;
  std::string msg = std::string(call) + " failed: " + (name ? name : "cuBLAS status") + " (" +
                    std::to_string(s) + ")";
  if (text) msg += ": " + std::string(text);
  throw CudaError(call, s, msg);
}

int dtype_code(const std::string& dtype) {
  if (dtype == "float32") return kR32F;
  if (dtype == "float16") return kR16F;
  if (dtype == "bfloat16") return kR16BF;
  throw py::value_error("cublasLt matmul: dtype must be float32, float16 or bfloat16, got " +
                        dtype);
}

const char* dtype_name(int code) {
  return code == kR32F ? "float32" : code == kR16F ? "float16" : "bfloat16";
}

int64_t itemsize(int code) { return code == kR32F ? 4 : code == kR8FE4M3 ? 1 : 2; }

// RAII wrappers of the opaque objects.
struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque* p) const { api().cublasLtMatmulDescDestroy(p); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque* p) const { api().cublasLtMatrixLayoutDestroy(p); }
};
struct PrefDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque* p) const {
    api().cublasLtMatmulPreferenceDestroy(p);
  }
};
using Desc = std::unique_ptr<cublasLtMatmulDescOpaque, DescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque, LayoutDeleter>;
using Pref = std::unique_ptr<cublasLtMatmulPreferenceOpaque, PrefDeleter>;

// One cuBLASLt handle per device, created on first use and kept for the process (handles
// destroyed at interpreter exit could outlive the context).
LtHandle handle_for(int device) {
  static std::mutex mu;
  static auto* handles = new std::map<int, LtHandle>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles->find(device);
  if (it != handles->end()) return it->second;
  LtHandle h = nullptr;
  check_lt(api().cublasLtCreate(&h), "cublasLtCreate");
  (*handles)[device] = h;
  return h;
}

Layout make_layout(int type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                   int64_t stride) {
  LtLayout raw = nullptr;
  check_lt(api().cublasLtMatrixLayoutCreate(&raw, type, static_cast<uint64_t>(rows),
                                            static_cast<uint64_t>(cols), ld),
           "cublasLtMatrixLayoutCreate");
  Layout l(raw);
  if (batch > 1) {
    int32_t count = static_cast<int32_t>(batch);
    check_lt(api().cublasLtMatrixLayoutSetAttribute(raw, kLayoutBatchCount, &count, sizeof(count)),
             "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
    check_lt(api().cublasLtMatrixLayoutSetAttribute(raw, kLayoutStridedBatchOffset, &stride,
                                                    sizeof(stride)),
             "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
  }
  return l;
}

bool aligned(uint64_t ptr, int64_t align) { return ptr % static_cast<uint64_t>(align) == 0; }

}  // namespace

// -- the key --------------------------------------------------------------------------------

std::string LtPlanKey::str() const {
  std::ostringstream s;
  s << "dev" << device << " " << dtype_name(dtype) << (tf32 ? "/tf32" : "") << " m" << m << " n"
    << n << " k" << k << " A" << (trans_a ? "t" : "n") << lda << " B" << (trans_b ? "t" : "n")
    << ldb << " D" << ldd << (ldc > 0 ? " C" + std::to_string(ldc) : std::string()) << " batch"
    << batch << " strides(" << stride_a << "," << stride_b << "," << stride_d << ") "
    << kEpilogueNames[epilogue] << " align" << align << " ws" << workspace_bytes;
  if (in_dtype >= 0) {
    s << " in=e4m3 scales(" << scale_name(scale_a) << "," << scale_name(scale_b) << ")";
  }
  return s.str();
}

bool LtPlanKey::operator<(const LtPlanKey& o) const {
  auto t = [](const LtPlanKey& x) {
    return std::make_tuple(x.device, x.dtype, x.in_dtype, x.scale_a, x.scale_b, x.tf32, x.trans_a,
                           x.trans_b, x.m, x.n, x.k, x.lda, x.ldb, x.ldd, x.ldc, x.batch,
                           x.stride_a, x.stride_b, x.stride_d, x.epilogue, x.align,
                           x.workspace_bytes);
  };
  return t(*this) < t(o);
}

LtPlanKey make_lt_key(int64_t m, int64_t n, int64_t k, const std::string& dtype, int64_t lda,
                      int64_t ldb, int64_t ldd, bool trans_a, bool trans_b, int64_t batch,
                      int64_t stride_a, int64_t stride_b, int64_t stride_d,
                      const std::string& epilogue, bool tf32, int64_t align,
                      int64_t workspace_bytes, int device, int64_t ldc, const std::string& in_dtype,
                      const std::string& scale_a, const std::string& scale_b) {
  LtPlanKey key;
  key.device = device;
  key.dtype = dtype_code(dtype);
  auto bad = [](const std::string& what) { throw py::value_error("cublasLt matmul: " + what); };
  if (tf32 && key.dtype != kR32F) bad("tf32 applies to float32 only, got " + dtype);
  key.tf32 = tf32;
  if (m < 1 || n < 1 || k < 1) bad("m, n, k must be positive");
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  if (m > kMax || n > kMax || k > kMax || batch > kMax) bad("m, n, k and batch must fit int32");
  if (lda < (trans_a ? m : k)) bad("lda " + std::to_string(lda) + " is below the row length");
  if (ldb < (trans_b ? k : n)) bad("ldb " + std::to_string(ldb) + " is below the row length");
  if (ldd < n) bad("ldd " + std::to_string(ldd) + " is below n");
  if (ldc < 0 || (ldc > 0 && ldc < n)) bad("ldc " + std::to_string(ldc) + " is below n");
  if (batch < 1) bad("batch must be positive");
  if (ldc > 0 && batch > 1) bad("an added C (ldc > 0) takes a single matrix, not a batch");
  if (stride_a < 0 || stride_b < 0 || stride_d < 0) bad("batch strides must be >= 0");
  if (batch > 1 && stride_d < (m - 1) * ldd + n) bad("batches of D would overlap");
  if (align < itemsize(key.dtype) || align > 256 || (align & (align - 1)) != 0) {
    bad("align must be a power of two between the item size and 256");
  }
  if (workspace_bytes < 0) bad("workspace_bytes must be >= 0");
  key.epilogue = -1;
  for (int i = 0; i < kNumEpilogues; ++i) {
    if (epilogue == kEpilogueNames[i]) key.epilogue = i;
  }
  if (key.epilogue < 0) bad("epilogue must be none, bias, gelu or gelu_bias, got " + epilogue);
  // cuBLASLt adds C before the activation; a residual comes after it.
  if (ldc > 0 && key.epilogue >= 2) bad("an added C (ldc > 0) takes the none or bias epilogue");
  if (!in_dtype.empty()) {
    if (in_dtype != "float8_e4m3") bad("in_dtype must be float8_e4m3 or empty, got " + in_dtype);
    key.in_dtype = kR8FE4M3;
    // FP8 tensor cores take A and B with K contiguous (cuBLASLt's "TN"), whole 16-byte rows.
    if (trans_a || !trans_b) bad("FP8 operands need A [M, K] and B stored [N, K] (trans_b)");
    if (lda % 16 || ldb % 16 || k % 16) bad("FP8 operands need K and row strides of 16s");
    if (batch > 1) bad("FP8 operands take a single matrix, not a batch");
    if (tf32) bad("tf32 does not apply to FP8 operands");
    auto mode = [&](const std::string& name, bool a) {
      for (const ScaleMode& s : kScaleModes) {
        if (name == s.name && (a ? s.for_a : s.for_b)) return s.value;
      }
      bad(std::string("scale_") + (a ? "a" : "b") + " " + name + " is not a scale mode of " +
          (a ? "A (scalar, outer_vec, vec128)" : "B (scalar, outer_vec, vec128, blk128x128)"));
      return -1;
    };
    key.scale_a = mode(scale_a, true);
    key.scale_b = mode(scale_b, false);
  } else if (!scale_a.empty() || !scale_b.empty()) {
    bad("scales apply to FP8 operands only (in_dtype float8_e4m3)");
  }
  key.trans_a = trans_a;
  key.trans_b = trans_b;
  key.m = m, key.n = n, key.k = k;
  key.lda = lda, key.ldb = ldb, key.ldd = ldd;
  key.ldc = ldc;
  key.batch = batch;
  // A stride is meaningless for a single matrix: normalised so equal problems share a plan.
  key.stride_a = batch > 1 ? stride_a : 0;
  key.stride_b = batch > 1 ? stride_b : 0;
  key.stride_d = batch > 1 ? stride_d : 0;
  key.align = align;
  key.workspace_bytes = workspace_bytes;
  return key;
}

// -- loading ---------------------------------------------------------------------------------

std::string cublaslt_load(const std::vector<std::string>& candidates) {
  std::lock_guard<std::mutex> lock(g_load_mu);
  if (g_api.load()) return g_path;
  std::string tried;
  LtApi a;
  auto resolve = [&a](void* lib, std::string* missing) {
#define PGK_RESOLVE(name, ret, sig) pgk::resolve_symbol(lib, #name, a.name, missing);
    PGK_LT_ENTRY_POINTS(PGK_RESOLVE)
#undef PGK_RESOLVE
    // Status names only improve messages: absent in some builds, so not required.
    a.cublasLtGetStatusName =
        reinterpret_cast<decltype(a.cublasLtGetStatusName)>(dlsym(lib, "cublasLtGetStatusName"));
    a.cublasLtGetStatusString = reinterpret_cast<decltype(a.cublasLtGetStatusString)>(
        dlsym(lib, "cublasLtGetStatusString"));
  };
  if (std::optional<std::string> path = pgk::open_first(candidates, resolve, &tried)) {
    *g_api_storage = a;
    g_path = *path;
    g_api.store(g_api_storage, std::memory_order_release);
    return g_path;
  }
  throw CudaError("load libcublasLt", -1,
                  "cannot load cuBLASLt (pip install nvidia-cublas); tried:" +
                      (tried.empty() ? std::string(" no candidates") : tried));
}

bool cublaslt_loaded() { return g_api.load() != nullptr; }

namespace {

std::string loaded_path() {
  std::lock_guard<std::mutex> lock(g_load_mu);
  return g_path;
}

// -- plans -----------------------------------------------------------------------------------

// Descriptors, layouts and the heuristic's algorithm for one problem. The bias pointer is
// a descriptor attribute, so run() sets it under the plan's mutex.
class LtPlan {
 public:
  explicit LtPlan(const LtPlanKey& key) : key_(key), ctx_(current_context()) {
    const LtApi& a = api();
    ctx_->make_current();
    handle_ = handle_for(key.device);
    LtDesc raw = nullptr;
    int compute = key.tf32 ? kCompute32FFastTF32 : kCompute32F;
    check_lt(a.cublasLtMatmulDescCreate(&raw, compute, kR32F), "cublasLtMatmulDescCreate");
    desc_.reset(raw);
    // Column-major cuBLASLt sees the row-major D^T = op(B)^T op(A)^T: its "A" is our B.
    int op_a = key.trans_b ? kOpT : kOpN, op_b = key.trans_a ? kOpT : kOpN;
    set_desc(kDescTransA, &op_a, sizeof(op_a), "TRANSA");
    set_desc(kDescTransB, &op_b, sizeof(op_b), "TRANSB");
    uint32_t epi = kEpilogueValues[key.epilogue];
    set_desc(kDescEpilogue, &epi, sizeof(epi), "EPILOGUE");
    if (key.in_dtype >= 0) {
      // cuBLASLt's A is our B (the weight), its B our A: each takes the other's scale.
      int32_t mode_a = key.scale_b, mode_b = key.scale_a;
      set_desc(kDescAScaleMode, &mode_a, sizeof(mode_a), "A_SCALE_MODE");
      set_desc(kDescBScaleMode, &mode_b, sizeof(mode_b), "B_SCALE_MODE");
      // Without scale pointers the heuristic refuses every mode but the scalar one (cuBLASLt
      // 13.1): stand-ins here, the real ones set by each launch.
      const void* fake = reinterpret_cast<const void*>(uintptr_t{1} << 20);
      set_desc(kDescAScalePointer, &fake, sizeof(fake), "A_SCALE_POINTER");
      set_desc(kDescBScalePointer, &fake, sizeof(fake), "B_SCALE_POINTER");
    }
    if (epilogue_has_bias(key.epilogue)) {
      // The heuristic reads the pointer's alignment only: a stand-in with the promised one.
      const void* fake = reinterpret_cast<const void*>(uintptr_t{1} << 20 | key.align);
      set_desc(kDescBiasPointer, &fake, sizeof(fake), "BIAS_POINTER");
    }
    int t = key.in_dtype >= 0 ? key.in_dtype : key.dtype;
    lt_a_ = key.trans_b ? make_layout(t, key.k, key.n, key.ldb, key.batch, key.stride_b)
                        : make_layout(t, key.n, key.k, key.ldb, key.batch, key.stride_b);
    lt_b_ = key.trans_a ? make_layout(t, key.m, key.k, key.lda, key.batch, key.stride_a)
                        : make_layout(t, key.k, key.m, key.lda, key.batch, key.stride_a);
    lt_d_ = make_layout(key.dtype, key.n, key.m, key.ldd, key.batch, key.stride_d);
    // C (the added residual) has D's type and shape, its own row stride; without one, C is
    // D's layout (beta = 0 never reads it).
    if (key.ldc > 0) lt_c_ = make_layout(key.dtype, key.n, key.m, key.ldc, 1, 0);

    LtPref rawp = nullptr;
    check_lt(a.cublasLtMatmulPreferenceCreate(&rawp), "cublasLtMatmulPreferenceCreate");
    Pref pref(rawp);
    uint64_t ws = static_cast<uint64_t>(key.workspace_bytes);
    check_lt(a.cublasLtMatmulPreferenceSetAttribute(rawp, kPrefMaxWorkspace, &ws, sizeof(ws)),
             "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    uint32_t al = static_cast<uint32_t>(key.align);
    for (int attr : {kPrefMinAlignA, kPrefMinAlignB, kPrefMinAlignC, kPrefMinAlignD}) {
      check_lt(a.cublasLtMatmulPreferenceSetAttribute(rawp, attr, &al, sizeof(al)),
               "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
    }
    // The heuristic's best few: the first serves until tune() times them on the problem.
    LtHeuristic results[kCandidates] = {};
    int found = 0;
    check_lt(
        a.cublasLtMatmulAlgoGetHeuristic(handle_, desc_.get(), lt_a_.get(), lt_b_.get(), c_layout(),
                                         lt_d_.get(), rawp, kCandidates, results, &found),
        "cublasLtMatmulAlgoGetHeuristic");
    for (int i = 0; i < found; ++i) {
      if (results[i].state == kLtSuccess) candidates_.push_back(results[i]);
    }
    if (candidates_.empty()) {
      throw CudaError("cublasLtMatmulAlgoGetHeuristic", kLtNotSupported,
                      "cublasLtMatmulAlgoGetHeuristic found no algorithm for " + key.str());
    }
    algo_ = candidates_[0].algo;
    workspace_needed_ = candidates_[0].workspace_size;
  }

  const LtPlanKey& key() const { return key_; }
  size_t workspace_needed() const { return workspace_needed_; }
  int candidates() const { return static_cast<int>(candidates_.size()); }
  int chosen() const { return chosen_; }

  // Times each candidate on these operands (one warm-up launch, then `reps` between two
  // events on `stream`, waiting for them) and keeps the fastest for every later run: the
  // heuristic's first pick is not always the fastest kernel for the shape. Returns the
  // chosen candidate's index (0: the heuristic's), or -1 without timing anything while
  // `stream` is being captured (a dry run's stand-in pointers, or a graph being recorded:
  // nothing may execute or wait there). D is overwritten; C and the bias are only read.
  // flush (flush_bytes, at least the L2's size): scratch overwritten before each timed
  // launch, then A copied into its start, so each launch finds B (the weight) cold and A
  // (the activation the previous kernel just wrote) hot, as in a model's sequence of
  // GEMMs; timed hot, repeated launches of one GEMM pick a kernel that is slower there.
  int tune(uint64_t a, uint64_t b, uint64_t d, uint64_t bias, uint64_t c, uint64_t workspace,
           uint64_t workspace_bytes, CUstream stream, int reps, uint64_t flush = 0,
           uint64_t flush_bytes = 0, uint64_t a_scale = 0, uint64_t b_scale = 0) {
    check_pointers(a, b, d, bias, c, a_scale, b_scale);
    ctx_->make_current();
    const cu::DriverApi& drv = driver();
    int capture_status = 0;
    check_cu(drv.cuStreamIsCapturing(stream, &capture_status), "cuStreamIsCapturing");
    if (capture_status != 0) return -1;
    std::lock_guard<std::mutex> lock(mu_);
    if (chosen_ >= 0) return chosen_;
    if (candidates_.size() > 1 && reps > 0) {
      CUevent start = nullptr, stop = nullptr;
      check_cu(drv.cuEventCreate(&start, cu::kEventDefault), "cuEventCreate");
      if (drv.cuEventCreate(&stop, cu::kEventDefault) != cu::kSuccess) {
        drv.cuEventDestroy(start);
        throw CudaError("cuEventCreate", -1, "cuEventCreate failed while tuning a GEMM");
      }
      // A's extent: a column-major [k, m] (or, transposed, [m, k]) of leading dim lda.
      const uint64_t a_bytes =
          static_cast<uint64_t>(key_.trans_a ? (key_.k - 1) * key_.lda + key_.m
                                             : (key_.m - 1) * key_.lda + key_.k) *
          static_cast<uint64_t>(itemsize(key_.in_dtype >= 0 ? key_.in_dtype : key_.dtype));
      const bool cold = flush != 0 && flush_bytes >= a_bytes && key_.batch == 1;
      float best = -1.0f;
      int best_i = 0;
      for (size_t i = 0; i < candidates_.size(); ++i) {
        const LtHeuristic& h = candidates_[i];
        if (h.workspace_size > 0 && (!workspace || workspace_bytes < h.workspace_size)) continue;
        auto once = [&]() {
          return launch(h.algo, h.workspace_size, a, b, d, bias, c, workspace, workspace_bytes,
                        stream, a_scale, b_scale);
        };
        bool ok = once();  // warm-up
        float ms = 0.0f;
        if (cold) {
          for (int r = 0; ok && r < reps; ++r) {
            check_cu(drv.cuMemsetD32Async(flush, 0, flush_bytes / 4, stream), "cuMemsetD32Async");
            check_cu(drv.cuMemcpyDtoDAsync(flush, a, a_bytes, stream), "cuMemcpyDtoDAsync");
            check_cu(drv.cuEventRecord(start, stream), "cuEventRecord");
            ok = once();
            check_cu(drv.cuEventRecord(stop, stream), "cuEventRecord");
            check_cu(drv.cuEventSynchronize(stop), "cuEventSynchronize");
            float one = 0.0f;
            check_cu(drv.cuEventElapsedTime(&one, start, stop), "cuEventElapsedTime");
            ms += one;
          }
        } else {
          check_cu(drv.cuEventRecord(start, stream), "cuEventRecord");
          for (int r = 0; ok && r < reps; ++r) ok = once();
          check_cu(drv.cuEventRecord(stop, stream), "cuEventRecord");
          check_cu(drv.cuEventSynchronize(stop), "cuEventSynchronize");
          check_cu(drv.cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
        }
        if (ok && (best < 0.0f || ms < best)) best = ms, best_i = static_cast<int>(i);
      }
      drv.cuEventDestroy(start);
      drv.cuEventDestroy(stop);
      algo_ = candidates_[best_i].algo;
      workspace_needed_ = candidates_[best_i].workspace_size;
      chosen_ = best_i;
    } else {
      chosen_ = 0;
    }
    return chosen_;
  }

  // Takes candidate i as the algorithm, untimed: the choice an earlier tune() of the same
  // problem made (another process's: the Python side keeps them on disk). False, with
  // nothing changed, where i is out of range, needs more workspace than the plan was made
  // for, or another candidate is chosen already.
  bool choose(int i) {
    std::lock_guard<std::mutex> lock(mu_);
    if (i < 0 || i >= static_cast<int>(candidates_.size())) return false;
    if (chosen_ >= 0) return chosen_ == i;
    const LtHeuristic& h = candidates_[static_cast<size_t>(i)];
    if (h.workspace_size > static_cast<size_t>(key_.workspace_bytes)) return false;
    algo_ = h.algo;
    workspace_needed_ = h.workspace_size;
    chosen_ = i;
    return true;
  }

  // Candidate i's algorithm as hex (its opaque bytes): a kept choice names the algorithm,
  // so a heuristic that offers other candidates (another cuBLASLt) is noticed. "" where i
  // is out of range.
  std::string candidate_id(int i) const {
    if (i < 0 || i >= static_cast<int>(candidates_.size())) return "";
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (uint64_t word : candidates_[static_cast<size_t>(i)].algo.data) {
      for (int shift = 60; shift >= 0; shift -= 4) out += digits[(word >> shift) & 0xF];
    }
    return out;
  }

  void run(uint64_t a, uint64_t b, uint64_t d, uint64_t bias, uint64_t workspace,
           uint64_t workspace_bytes, CUstream stream, uint64_t c = 0, uint64_t a_scale = 0,
           uint64_t b_scale = 0) {
    check_pointers(a, b, d, bias, c, a_scale, b_scale);
    if (workspace_needed_ > 0 && (!workspace || workspace_bytes < workspace_needed_)) {
      throw py::value_error("cublasLt matmul: needs a workspace of " +
                            std::to_string(workspace_needed_) + " bytes, got " +
                            std::to_string(workspace ? workspace_bytes : 0));
    }
    ctx_->make_current();
    std::lock_guard<std::mutex> lock(mu_);
    if (!launch(algo_, workspace_needed_, a, b, d, bias, c, workspace, workspace_bytes, stream,
                a_scale, b_scale)) {
      check_lt(last_status_, "cublasLtMatmul");
    }
  }

 private:
  static constexpr int kCandidates = 8;

  void check_pointers(uint64_t a, uint64_t b, uint64_t d, uint64_t bias, uint64_t c,
                      uint64_t a_scale, uint64_t b_scale) const {
    const bool has_bias = epilogue_has_bias(key_.epilogue);
    const bool has_c = key_.ldc > 0;
    if (key_.in_dtype >= 0 && (!a_scale || !b_scale || a_scale % 4 || b_scale % 4)) {
      throw py::value_error("cublasLt matmul: FP8 operands need both scale pointers (float32)");
    }
    if (!a || !b || !d || (has_bias && !bias) || (has_c && !c)) {
      throw py::value_error("cublasLt matmul: null pointer" +
                            std::string(has_bias && !bias ? " (the epilogue needs a bias)"
                                        : has_c && !c     ? " (the plan adds a C: pass c)"
                                                          : ""));
    }
    if (!aligned(a, key_.align) || !aligned(b, key_.align) || !aligned(d, key_.align) ||
        (has_bias && !aligned(bias, key_.align)) || (has_c && !aligned(c, key_.align))) {
      throw py::value_error("cublasLt matmul: a pointer is less aligned than the plan's " +
                            std::to_string(key_.align) + " bytes");
    }
  }

  // One cublasLtMatmul with `algo` (the caller holds mu_: the bias pointer is a descriptor
  // attribute). False, with last_status_ set, where cuBLASLt refused it.
  bool launch(const LtAlgo& algo, size_t ws_needed, uint64_t a, uint64_t b, uint64_t d,
              uint64_t bias, uint64_t c, uint64_t workspace, uint64_t workspace_bytes,
              CUstream stream, uint64_t a_scale = 0, uint64_t b_scale = 0) {
    const LtApi& api_ = api();
    const bool has_c = key_.ldc > 0;
    const float alpha = 1.0f, beta = has_c ? 1.0f : 0.0f;
    if (epilogue_has_bias(key_.epilogue)) {
      const void* p = reinterpret_cast<const void*>(bias);
      set_desc(kDescBiasPointer, &p, sizeof(p), "BIAS_POINTER");
    }
    if (key_.in_dtype >= 0) {  // cuBLASLt's A is our B: its A scale is b_scale
      const void* pa = reinterpret_cast<const void*>(b_scale);
      const void* pb = reinterpret_cast<const void*>(a_scale);
      set_desc(kDescAScalePointer, &pa, sizeof(pa), "A_SCALE_POINTER");
      set_desc(kDescBScalePointer, &pb, sizeof(pb), "B_SCALE_POINTER");
    }
    auto ptr = [](uint64_t v) { return reinterpret_cast<void*>(v); };
    last_status_ = api_.cublasLtMatmul(handle_, desc_.get(), &alpha, ptr(b), lt_a_.get(), ptr(a),
                                       lt_b_.get(), &beta, ptr(has_c ? c : d), c_layout(), ptr(d),
                                       lt_d_.get(), &algo, ws_needed ? ptr(workspace) : nullptr,
                                       ws_needed ? workspace_bytes : 0, stream);
    return last_status_ == kLtSuccess;
  }

  LtLayout c_layout() const { return key_.ldc > 0 ? lt_c_.get() : lt_d_.get(); }

  void set_desc(int attr, const void* value, size_t size, const char* what) {
    cublasStatus s = api().cublasLtMatmulDescSetAttribute(desc_.get(), attr, value, size);
    check_lt(s, (std::string("cublasLtMatmulDescSetAttribute(") + what + ")").c_str());
  }

  LtPlanKey key_;
  std::shared_ptr<Context> ctx_;
  LtHandle handle_ = nullptr;
  Desc desc_;
  Layout lt_a_, lt_b_, lt_c_, lt_d_;
  LtAlgo algo_{};
  size_t workspace_needed_ = 0;
  std::vector<LtHeuristic> candidates_;
  int chosen_ = -1;  // the tuned candidate; -1 until tune() ran
  cublasStatus last_status_ = kLtSuccess;
  std::mutex mu_;
};

struct PlanCache {
  std::mutex mu;
  std::map<LtPlanKey, std::shared_ptr<LtPlan>> plans;
  int64_t hits = 0, misses = 0;
};

// Leaked on purpose: plans hold contexts, which must not be released after the driver.
PlanCache& cache() {
  static auto* c = new PlanCache();
  return *c;
}

std::shared_ptr<LtPlan> get_plan(const LtPlanKey& key) {
  PlanCache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.plans.find(key);
    if (it != c.plans.end()) {
      ++c.hits;
      return it->second;
    }
  }
  auto plan = std::make_shared<LtPlan>(key);  // outside the lock: the heuristic takes a while
  std::lock_guard<std::mutex> lock(c.mu);
  ++c.misses;
  auto [it, inserted] = c.plans.emplace(key, plan);
  return it->second;
}

}  // namespace

void register_cublaslt(py::module_& m) {
  m.def("cublaslt_load", &cublaslt_load, py::arg("candidates"),
        py::call_guard<py::gil_scoped_release>(),
        "Load cuBLASLt from the first loadable path; returns it. Idempotent. CUDAError "
        "(call 'load libcublasLt') lists what was tried.");
  m.def(
      "cublaslt_warm",
      [](const std::string& dtype) {
        // The library's one-time costs, off the first GEMM's path: the device's handle and
        // the first heuristic query (its tables), on a plan that is not kept.
        api();
        LtPlanKey key = make_lt_key(64, 64, 64, dtype, 64, 64, 64, false, false, 1, 0, 0, 0, "none",
                                    false, 16, 0, get_device(), 0);
        LtPlan warm(key);
      },
      py::arg("dtype") = "bfloat16", py::call_guard<py::gil_scoped_release>(),
      "Create the current device's cuBLASLt handle and run one heuristic query (a "
      "64^3 GEMM of `dtype`) whose plan is not cached; the interpreter lock is released.");
  m.def("cublaslt_loaded", &cublaslt_loaded);
  m.def("cublaslt_path", &loaded_path, "Path cuBLASLt was loaded from ('' if not loaded).");
  m.def("cublaslt_version", []() { return static_cast<int64_t>(api().cublasLtGetVersion()); });

  py::class_<LtPlan, std::shared_ptr<LtPlan>>(m, "LtMatmul")
      .def_property_readonly("key", [](const LtPlan& p) { return p.key().str(); })
      .def_property_readonly("workspace_needed", &LtPlan::workspace_needed)
      .def_property_readonly("candidates", &LtPlan::candidates,
                             "How many algorithms the heuristic offered (tune() times them).")
      .def_property_readonly("chosen", &LtPlan::chosen,
                             "The tuned candidate's index (0: the heuristic's first); -1 "
                             "until tune() ran.")
      .def("choose", &LtPlan::choose, py::arg("index"),
           "Take candidate `index` as the algorithm, untimed (a choice tune() made before); "
           "False, nothing changed, where it is out of range, needs more workspace than the "
           "plan's or another is chosen.")
      .def("candidate_id", &LtPlan::candidate_id, py::arg("index"),
           "Candidate `index`'s algorithm as hex ('' out of range).")
      .def(
          "tune",
          [](LtPlan& p, uint64_t a, uint64_t b, uint64_t d, uint64_t bias, uint64_t c,
             uint64_t workspace, uint64_t workspace_bytes, py::handle stream, int reps,
             uint64_t flush, uint64_t flush_bytes, uint64_t a_scale, uint64_t b_scale) {
            CUstream s = stream_handle(stream);
            py::gil_scoped_release release;
            return p.tune(a, b, d, bias, c, workspace, workspace_bytes, s, reps, flush, flush_bytes,
                          a_scale, b_scale);
          },
          py::arg("a"), py::arg("b"), py::arg("d"), py::arg("bias") = 0, py::arg("c") = 0,
          py::arg("workspace") = 0, py::arg("workspace_bytes") = 0, py::arg("stream") = py::none(),
          py::arg("reps") = 3, py::arg("flush") = 0, py::arg("flush_bytes") = 0,
          py::arg("a_scale") = 0, py::arg("b_scale") = 0,
          "Time the heuristic's candidates on these operands (D is overwritten) and keep the "
          "fastest; waits for `stream`. flush: a scratch of flush_bytes (>= the L2) "
          "overwritten before each timed launch, A then copied into it: B cold, A hot, as "
          "in a model's sequence of GEMMs (0: back-to-back launches, all hot). Returns the "
          "chosen index, or -1 (nothing run) while `stream` is being captured. Once chosen, "
          "later calls return it at once.")
      .def(
          "run",
          [](LtPlan& p, uint64_t a, uint64_t b, uint64_t d, uint64_t bias, uint64_t workspace,
             uint64_t workspace_bytes, py::handle stream, uint64_t c, uint64_t a_scale,
             uint64_t b_scale) {
            p.run(a, b, d, bias, workspace, workspace_bytes, stream_handle(stream), c, a_scale,
                  b_scale);
          },
          py::arg("a"), py::arg("b"), py::arg("d"), py::arg("bias") = 0, py::arg("workspace") = 0,
          py::arg("workspace_bytes") = 0, py::arg("stream") = py::none(), py::arg("c") = 0,
          py::arg("a_scale") = 0, py::arg("b_scale") = 0,
          "D = epilogue(op(A) @ op(B) + bias) (+ C when the plan has ldc) on `stream` "
          "(asynchronous); FP8 plans take A's and B's float32 scales (a_scale, b_scale).");

  m.def(
      "cublaslt_plan_key",
      [](int64_t m_, int64_t n, int64_t k, const std::string& dtype, int64_t lda, int64_t ldb,
         int64_t ldd, bool trans_a, bool trans_b, int64_t batch, int64_t stride_a, int64_t stride_b,
         int64_t stride_d, const std::string& epilogue, bool tf32, int64_t align,
         int64_t workspace_bytes, int device, int64_t ldc, const std::string& in_dtype,
         const std::string& scale_a, const std::string& scale_b) {
        return make_lt_key(m_, n, k, dtype, lda, ldb, ldd, trans_a, trans_b, batch, stride_a,
                           stride_b, stride_d, epilogue, tf32, align, workspace_bytes, device, ldc,
                           in_dtype, scale_a, scale_b)
            .str();
      },
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("dtype"), py::kw_only(), py::arg("lda"),
      py::arg("ldb"), py::arg("ldd"), py::arg("trans_a") = false, py::arg("trans_b") = false,
      py::arg("batch") = 1, py::arg("stride_a") = 0, py::arg("stride_b") = 0,
      py::arg("stride_d") = 0, py::arg("epilogue") = "none", py::arg("tf32") = false,
      py::arg("align") = 16, py::arg("workspace_bytes") = 0, py::arg("device") = 0,
      py::arg("ldc") = 0, py::arg("in_dtype") = "", py::arg("scale_a") = "",
      py::arg("scale_b") = "",
      "The plan-cache key of a problem (validates it; needs no library or device).");
  m.def(
      "cublaslt_plan",
      [](int64_t m_, int64_t n, int64_t k, const std::string& dtype, int64_t lda, int64_t ldb,
         int64_t ldd, bool trans_a, bool trans_b, int64_t batch, int64_t stride_a, int64_t stride_b,
         int64_t stride_d, const std::string& epilogue, bool tf32, int64_t align,
         int64_t workspace_bytes, int64_t ldc, const std::string& in_dtype,
         const std::string& scale_a, const std::string& scale_b) {
        api();  // not loaded: CUDAError before any validation that needs the device
        LtPlanKey key = make_lt_key(m_, n, k, dtype, lda, ldb, ldd, trans_a, trans_b, batch,
                                    stride_a, stride_b, stride_d, epilogue, tf32, align,
                                    workspace_bytes, get_device(), ldc, in_dtype, scale_a, scale_b);
        return get_plan(key);
      },
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("dtype"), py::kw_only(), py::arg("lda"),
      py::arg("ldb"), py::arg("ldd"), py::arg("trans_a") = false, py::arg("trans_b") = false,
      py::arg("batch") = 1, py::arg("stride_a") = 0, py::arg("stride_b") = 0,
      py::arg("stride_d") = 0, py::arg("epilogue") = "none", py::arg("tf32") = false,
      py::arg("align") = 16, py::arg("workspace_bytes") = 0, py::arg("ldc") = 0,
      py::arg("in_dtype") = "", py::arg("scale_a") = "", py::arg("scale_b") = "",
      "The cached plan of a row-major GEMM on the current device (heuristic on first use); "
      "ldc > 0 adds a C of that row stride (beta = 1); in_dtype float8_e4m3: A and B are "
      "e4m3 with scales of the modes scale_a and scale_b (dtype is D's).");
  m.def("cublaslt_cache_stats", []() {
    PlanCache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    py::dict d;
    d["plans"] = static_cast<int64_t>(c.plans.size());
    d["hits"] = c.hits;
    d["misses"] = c.misses;
    return d;
  });
  m.def("cublaslt_cache_clear", []() {
    PlanCache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    c.plans.clear();
    c.hits = c.misses = 0;
  });
}

}  // namespace pgk
