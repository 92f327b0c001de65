// kt_kernel._core: the baseline extension. It detects the CPU, loads the one
// variant library the Python loader chose, and forwards calls to it. Built for
// the x86-64 baseline; the variant libraries are never linked, only dlopen()ed.
#include <dlfcn.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "detect.h"
#include "kt_cpu_api.h"

namespace py = pybind11;

namespace {

class Variant {
 public:
  explicit Variant(const std::string& path) : path_(path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) throw std::runtime_error(std::string("cannot load CPU variant library: ") + dlerror());
    auto fn = reinterpret_cast<kt_cpu_variant_ops_fn>(dlsym(handle_, "kt_cpu_variant_ops"));
    if (!fn) throw std::runtime_error(path + " does not export kt_cpu_variant_ops; it is not a kt_kernel CPU variant");
    ops_ = fn();
    if (!ops_ || ops_->abi_version != KT_CPU_ABI_VERSION)
      throw std::runtime_error(path + " was built for another kt_kernel CPU ABI (expected version " +
                               std::to_string(KT_CPU_ABI_VERSION) + "); reinstall kt-kernel");
  }
  // Never dlclose: worker threads and returned pointers may outlive this object.
  std::string name() const { return ops_->name; }
  std::string path() const { return path_; }

  // The Python layer checked dtypes, shapes and contiguity; here we only take pointers.
  static void* ptr(const py::object& b, bool writable) {
    if (b.is_none()) return nullptr;
    return py::reinterpret_borrow<py::buffer>(b).request(writable).ptr;
  }

  static kt_moe_args args(py::buffer x, py::buffer ids, py::buffer weights, py::buffer gate_q, py::buffer gate_s,
                          py::buffer up_q, py::buffer up_s, py::buffer down_q, py::buffer down_s, py::buffer y,
                          int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t topk, int x_dtype,
                          int wfmt, int group_size, int num_threads, const py::object& lora, int rank, float scale,
                          const py::object& saved) {
    kt_moe_args a{};
    a.tokens = tokens;
    a.hidden = hidden;
    a.inter = inter;
    a.experts = experts;
    a.topk = topk;
    a.x_dtype = x_dtype;
    a.wfmt = wfmt;
    a.group_size = group_size;
    a.num_threads = num_threads;
    a.x = ptr(x, false);
    a.ids = static_cast<const int64_t*>(ptr(ids, false));
    a.weights = static_cast<const float*>(ptr(weights, false));
    a.gate = {ptr(gate_q, false), static_cast<const float*>(ptr(gate_s, false))};
    a.up = {ptr(up_q, false), static_cast<const float*>(ptr(up_s, false))};
    a.down = {ptr(down_q, false), static_cast<const float*>(ptr(down_s, false))};
    a.y = ptr(y, true);
    if (!lora.is_none() && rank > 0) {
      auto t = lora.cast<py::tuple>();  // gate A, gate B, up A, up B, down A, down B
      if (t.size() != 6) throw py::value_error("lora must be 6 buffers: gate A/B, up A/B, down A/B");
      a.lora = {rank,
                scale,
                static_cast<const float*>(ptr(t[0], false)),
                static_cast<const float*>(ptr(t[1], false)),
                static_cast<const float*>(ptr(t[2], false)),
                static_cast<const float*>(ptr(t[3], false)),
                static_cast<const float*>(ptr(t[4], false)),
                static_cast<const float*>(ptr(t[5], false))};
    }
    if (!saved.is_none()) {
      auto t = saved.cast<py::tuple>();  // gate, up, lora (or None)
      if (t.size() != 3) throw py::value_error("saved must be 3 buffers: gate, up, lora");
      a.saved = {static_cast<float*>(ptr(t[0], true)), static_cast<float*>(ptr(t[1], true)),
                 static_cast<float*>(ptr(t[2], true))};
    }
    return a;
  }

  void moe_forward(py::buffer x, py::buffer ids, py::buffer weights, py::buffer gate_q, py::buffer gate_s,
                   py::buffer up_q, py::buffer up_s, py::buffer down_q, py::buffer down_s, py::buffer y,
                   int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t topk, int x_dtype,
                   int wfmt, int group_size, int num_threads, const py::object& lora, int rank, float scale,
                   const py::object& saved) {
    const kt_moe_args a = args(x, ids, weights, gate_q, gate_s, up_q, up_s, down_q, down_s, y, tokens, hidden, inter,
                               experts, topk, x_dtype, wfmt, group_size, num_threads, lora, rank, scale, saved);
    char err[512] = {0};
    int rc;
    {
      py::gil_scoped_release release;
      rc = ops_->moe_forward(&a, err, sizeof err);
    }
    if (rc != 0) throw py::value_error(err);
  }

  void moe_backward(py::buffer x, py::buffer ids, py::buffer weights, py::buffer gate_q, py::buffer gate_s,
                    py::buffer up_q, py::buffer up_s, py::buffer down_q, py::buffer down_s, int64_t tokens,
                    int64_t hidden, int64_t inter, int64_t experts, int64_t topk, int x_dtype, int wfmt,
                    int group_size, int num_threads, const py::object& lora, int rank, float scale,
                    const py::object& saved, py::buffer dy, py::buffer dx, py::buffer dweights,
                    const py::object& dlora) {
    kt_moe_args a = args(x, ids, weights, gate_q, gate_s, up_q, up_s, down_q, down_s, dx, tokens, hidden, inter,
                         experts, topk, x_dtype, wfmt, group_size, num_threads, lora, rank, scale, saved);
    kt_moe_grad_args g{};
    g.dy = ptr(dy, false);
    g.dx = static_cast<float*>(ptr(dx, true));
    g.dweights = static_cast<float*>(ptr(dweights, true));
    if (!dlora.is_none() && a.lora.rank > 0) {
      auto t = dlora.cast<py::tuple>();
      if (t.size() != 6) throw py::value_error("dlora must be 6 buffers: gate A/B, up A/B, down A/B");
      float** d[6] = {&g.d_gate_a, &g.d_gate_b, &g.d_up_a, &g.d_up_b, &g.d_down_a, &g.d_down_b};
      for (size_t i = 0; i < 6; ++i) *d[i] = static_cast<float*>(ptr(t[i], true));
    }
    char err[512] = {0};
    int rc;
    {
      py::gil_scoped_release release;
      rc = ops_->moe_backward(&a, &g, err, sizeof err);
    }
    if (rc != 0) throw py::value_error(err);
  }

 private:
  std::string path_;
  void* handle_ = nullptr;
  const kt_cpu_ops* ops_ = nullptr;
};

py::dict detect() {
  const kt::CpuInfo info = kt::detect_cpu();
  py::dict features;
  for (const auto& kv : info.cpuid) features[py::str(kv.first)] = kv.second;
  py::dict d;
  d["vendor"] = info.vendor;
  d["brand"] = info.brand;
  d["cpuid"] = features;
  d["osxsave"] = info.osxsave;
  d["xcr0"] = info.xcr0;
  d["os_avx"] = info.os_avx;
  d["os_avx512"] = info.os_avx512;
  d["os_amx"] = info.os_amx;
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "kt_kernel baseline core: CPU detection and CPU-variant dispatch";
  m.attr("CPU_ABI_VERSION") = KT_CPU_ABI_VERSION;
  m.def("detect_cpu", &detect, "CPUID/XGETBV feature detection");
  m.def("request_amx_permission", &kt::request_amx_permission,
        "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA); returns 0 or an errno value");
  py::class_<Variant>(m, "Variant")
      .def(py::init<const std::string&>())
      .def_property_readonly("name", &Variant::name)
      .def_property_readonly("path", &Variant::path)
      .def("moe_forward", &Variant::moe_forward, py::arg("x"), py::arg("ids"), py::arg("weights"),
           py::arg("gate_q"), py::arg("gate_s"), py::arg("up_q"), py::arg("up_s"), py::arg("down_q"),
           py::arg("down_s"), py::arg("y"), py::arg("tokens"), py::arg("hidden"), py::arg("inter"),
           py::arg("experts"), py::arg("topk"), py::arg("x_dtype"), py::arg("wfmt"), py::arg("group_size"),
           py::arg("num_threads"), py::arg("lora") = py::none(), py::arg("rank") = 0, py::arg("scale") = 0.f,
           py::arg("saved") = py::none())
      .def("moe_backward", &Variant::moe_backward);
}
