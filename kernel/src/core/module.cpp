// kt_kernel._core: the baseline extension. It detects the CPU, loads the one
// variant library the Python loader chose, and forwards calls to it. Built for
// the x86-64 baseline; the variant libraries are never linked, only dlopen()ed.
//
// Written against CPython's Limited API (3.11: the first with the buffer protocol in
// it), so one `abi3` build serves every CPython of the release's matrix. Its
// interface is the one kt_kernel/_core.pyi types.
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>

#include <cstddef>
#include <string>

#include "detect.h"
#include "kt_cpu_api.h"

namespace {

struct VariantObject {
  PyObject_HEAD
  PyObject* path;       // str
  const kt_cpu_ops* ops;
};

// The buffers of one call: requested from their objects, released when the call ends.
class Buffers {
 public:
  Buffers() = default;
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    for (int i = 0; i < n_; ++i) PyBuffer_Release(&views_[i]);
  }
  // nullptr for None; nullptr with a Python error set when `obj` is not a (writable) buffer.
  bool get(PyObject* obj, bool writable, void** out, const char* what) {
    *out = nullptr;
    if (obj == Py_None) return true;
    if (n_ == kMax) {
      PyErr_SetString(PyExc_RuntimeError, "kt_kernel._core: too many buffers in one call");
      return false;
    }
    if (PyObject_GetBuffer(obj, &views_[n_], writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
      PyObject *type, *value, *tb;
      PyErr_Fetch(&type, &value, &tb);
      Py_XDECREF(type);
      Py_XDECREF(tb);
      PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s buffer (%S)", what, writable ? " writable" : "",
                   value ? value : Py_None);
      Py_XDECREF(value);
      return false;
    }
    *out = views_[n_++].buf;
    return true;
  }

 private:
  static constexpr int kMax = 32;
  Py_buffer views_[kMax];
  int n_ = 0;
};

// `obj`: None, or a tuple of exactly `n` buffers (None allowed for an entry).
bool tuple_of(Buffers& bufs, PyObject* obj, Py_ssize_t n, bool writable, void** out, const char* what) {
  for (Py_ssize_t i = 0; i < n; ++i) out[i] = nullptr;
  if (obj == Py_None) return true;
  if (!PyTuple_Check(obj) || PyTuple_Size(obj) != n) {
    PyErr_Format(PyExc_ValueError, "%s must be a tuple of %zd buffers", what, n);
    return false;
  }
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!bufs.get(PyTuple_GetItem(obj, i), writable, &out[i], what)) return false;
  return true;
}

// The arguments both calls share, parsed into `a`; x .. down_s, y (forward) or dx (backward).
struct Common {
  PyObject *x, *ids, *weights, *gate_q, *gate_s, *up_q, *up_s, *down_q, *down_s;
  long long tokens, hidden, inter, experts, topk;
  int x_dtype, wfmt, group_size, num_threads;
  PyObject* lora = Py_None;
  int rank = 0;
  float scale = 0.f;
  PyObject* saved = Py_None;
};

bool fill(Buffers& bufs, const Common& c, kt_moe_args* a) {
  *a = kt_moe_args{};
  a->tokens = c.tokens;
  a->hidden = c.hidden;
  a->inter = c.inter;
  a->experts = c.experts;
  a->topk = c.topk;
  a->x_dtype = c.x_dtype;
  a->wfmt = c.wfmt;
  a->group_size = c.group_size;
  a->num_threads = c.num_threads;
  void* p[9];
  PyObject* objs[9] = {c.x, c.ids, c.weights, c.gate_q, c.gate_s, c.up_q, c.up_s, c.down_q, c.down_s};
  static const char* names[9] = {"x", "ids", "weights", "gate_q", "gate_s", "up_q", "up_s", "down_q", "down_s"};
  for (int i = 0; i < 9; ++i)
    if (!bufs.get(objs[i], false, &p[i], names[i])) return false;
  a->x = p[0];
  a->ids = static_cast<const int64_t*>(p[1]);
  a->weights = static_cast<const float*>(p[2]);
  a->gate = {p[3], static_cast<const float*>(p[4])};
  a->up = {p[5], static_cast<const float*>(p[6])};
  a->down = {p[7], static_cast<const float*>(p[8])};
  if (c.lora != Py_None && c.rank > 0) {
    void* l[6];  // gate A, gate B, up A, up B, down A, down B
    if (!tuple_of(bufs, c.lora, 6, false, l, "lora (gate A/B, up A/B, down A/B)")) return false;
    a->lora = {c.rank,
               c.scale,
               static_cast<const float*>(l[0]),
               static_cast<const float*>(l[1]),
               static_cast<const float*>(l[2]),
               static_cast<const float*>(l[3]),
               static_cast<const float*>(l[4]),
               static_cast<const float*>(l[5])};
  }
  if (c.saved != Py_None) {
    void* s[3];  // gate, up, lora (or None)
    if (!tuple_of(bufs, c.saved, 3, true, s, "saved (gate, up, lora)")) return false;
    a->saved = {static_cast<float*>(s[0]), static_cast<float*>(s[1]), static_cast<float*>(s[2])};
  }
  return true;
}

PyObject* variant_forward(PyObject* self_obj, PyObject* args, PyObject* kwargs) {
  auto* self = reinterpret_cast<VariantObject*>(self_obj);
  static const char* kw[] = {"x",       "ids",   "weights", "gate_q", "gate_s",     "up_q",        "up_s",
                             "down_q",  "down_s", "y",      "tokens", "hidden",     "inter",       "experts",
                             "topk",    "x_dtype", "wfmt",  "group_size", "num_threads", "lora", "rank",
                             "scale",   "saved",  nullptr};
  Common c;
  PyObject* y;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOOLLLLLiiii|OifO:moe_forward", const_cast<char**>(kw),
                                   &c.x, &c.ids, &c.weights, &c.gate_q, &c.gate_s, &c.up_q, &c.up_s, &c.down_q,
                                   &c.down_s, &y, &c.tokens, &c.hidden, &c.inter, &c.experts, &c.topk, &c.x_dtype,
                                   &c.wfmt, &c.group_size, &c.num_threads, &c.lora, &c.rank, &c.scale, &c.saved))
    return nullptr;
  Buffers bufs;
  kt_moe_args a;
  if (!fill(bufs, c, &a) || !bufs.get(y, true, &a.y, "y")) return nullptr;
  char err[512] = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS;
  rc = self->ops->moe_forward(&a, err, sizeof err);
  Py_END_ALLOW_THREADS;
  if (rc != 0) {
    PyErr_SetString(PyExc_ValueError, err);
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* variant_backward(PyObject* self_obj, PyObject* args) {
  auto* self = reinterpret_cast<VariantObject*>(self_obj);
  Common c;
  PyObject *dy, *dx, *dweights, *dlora;
  if (!PyArg_ParseTuple(args, "OOOOOOOOOLLLLLiiiiOifOOOOO:moe_backward", &c.x, &c.ids, &c.weights, &c.gate_q,
                        &c.gate_s, &c.up_q, &c.up_s, &c.down_q, &c.down_s, &c.tokens, &c.hidden, &c.inter,
                        &c.experts, &c.topk, &c.x_dtype, &c.wfmt, &c.group_size, &c.num_threads, &c.lora, &c.rank,
                        &c.scale, &c.saved, &dy, &dx, &dweights, &dlora))
    return nullptr;
  Buffers bufs;
  kt_moe_args a;
  if (!fill(bufs, c, &a)) return nullptr;
  kt_moe_grad_args g{};
  void *pdy, *pdx, *pdw;
  if (!bufs.get(dy, false, &pdy, "dy") || !bufs.get(dx, true, &pdx, "dx") ||
      !bufs.get(dweights, true, &pdw, "dweights"))
    return nullptr;
  a.y = pdx;  // the forward's output slot holds dx, as the variant library expects
  g.dy = pdy;
  g.dx = static_cast<float*>(pdx);
  g.dweights = static_cast<float*>(pdw);
  if (dlora != Py_None && a.lora.rank > 0) {
    void* d[6];
    if (!tuple_of(bufs, dlora, 6, true, d, "dlora (gate A/B, up A/B, down A/B)")) return nullptr;
    g.d_gate_a = static_cast<float*>(d[0]);
    g.d_gate_b = static_cast<float*>(d[1]);
    g.d_up_a = static_cast<float*>(d[2]);
    g.d_up_b = static_cast<float*>(d[3]);
    g.d_down_a = static_cast<float*>(d[4]);
    g.d_down_b = static_cast<float*>(d[5]);
  }
  char err[512] = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS;
  rc = self->ops->moe_backward(&a, &g, err, sizeof err);
  Py_END_ALLOW_THREADS;
  if (rc != 0) {
    PyErr_SetString(PyExc_ValueError, err);
    return nullptr;
  }
  Py_RETURN_NONE;
}

int variant_init(PyObject* self_obj, PyObject* args, PyObject* kwargs) {
  auto* self = reinterpret_cast<VariantObject*>(self_obj);
  static const char* kw[] = {"path", nullptr};
  PyObject* path;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "U:Variant", const_cast<char**>(kw), &path)) return -1;
  PyObject* bytes = PyUnicode_EncodeFSDefault(path);
  if (!bytes) return -1;
  const std::string p(PyBytes_AsString(bytes), static_cast<size_t>(PyBytes_Size(bytes)));
  Py_DECREF(bytes);
  // Never dlclose: worker threads and returned pointers may outlive this object.
  void* handle = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    PyErr_Format(PyExc_RuntimeError, "cannot load CPU variant library: %s", dlerror());
    return -1;
  }
  auto fn = reinterpret_cast<kt_cpu_variant_ops_fn>(dlsym(handle, "kt_cpu_variant_ops"));
  if (!fn) {
    PyErr_Format(PyExc_RuntimeError, "%s does not export kt_cpu_variant_ops; it is not a kt_kernel CPU variant",
                 p.c_str());
    return -1;
  }
  const kt_cpu_ops* ops = fn();
  if (!ops || ops->abi_version != KT_CPU_ABI_VERSION) {
    PyErr_Format(PyExc_RuntimeError,
                 "%s was built for another kt_kernel CPU ABI (expected version %u); reinstall kt-kernel", p.c_str(),
                 static_cast<unsigned>(KT_CPU_ABI_VERSION));
    return -1;
  }
  Py_INCREF(path);
  PyObject* old = self->path;
  self->path = path;
  Py_XDECREF(old);
  self->ops = ops;
  return 0;
}

void variant_dealloc(PyObject* self_obj) {
  auto* self = reinterpret_cast<VariantObject*>(self_obj);
  PyTypeObject* tp = Py_TYPE(self_obj);
  Py_CLEAR(self->path);
  auto free_fn = reinterpret_cast<freefunc>(PyType_GetSlot(tp, Py_tp_free));
  free_fn(self_obj);
  Py_DECREF(tp);  // heap types own a reference from each instance
}

bool ready(VariantObject* self) {
  if (self->ops != nullptr) return true;
  PyErr_SetString(PyExc_RuntimeError, "kt_kernel._core.Variant was not initialised");
  return false;
}

PyObject* variant_name(PyObject* self_obj, void*) {
  auto* self = reinterpret_cast<VariantObject*>(self_obj);
  return ready(self) ? PyUnicode_FromString(self->ops->name) : nullptr;
}

PyObject* variant_path(PyObject* self_obj, void*) {
  auto* self = reinterpret_cast<VariantObject*>(self_obj);
  if (!ready(self)) return nullptr;
  Py_INCREF(self->path);
  return self->path;
}

PyObject* moe_forward(PyObject* self, PyObject* args, PyObject* kwargs) {
  return ready(reinterpret_cast<VariantObject*>(self)) ? variant_forward(self, args, kwargs) : nullptr;
}

PyObject* moe_backward(PyObject* self, PyObject* args) {
  return ready(reinterpret_cast<VariantObject*>(self)) ? variant_backward(self, args) : nullptr;
}

PyMethodDef variant_methods[] = {
    {"moe_forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(moe_forward)),
     METH_VARARGS | METH_KEYWORDS, "One MoE forward (the Python layer checked dtypes, shapes and contiguity)."},
    {"moe_backward", moe_backward, METH_VARARGS, "The backward of one training forward."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef variant_getset[] = {
    {"name", variant_name, nullptr, "the variant's name (cpu_variants.json)", nullptr},
    {"path", variant_path, nullptr, "the loaded library's path", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot variant_slots[] = {
    {Py_tp_doc, const_cast<char*>("Variant(path): one dlopen()ed CPU variant library")},
    {Py_tp_new, reinterpret_cast<void*>(PyType_GenericNew)},
    {Py_tp_init, reinterpret_cast<void*>(variant_init)},
    {Py_tp_dealloc, reinterpret_cast<void*>(variant_dealloc)},
    {Py_tp_methods, variant_methods},
    {Py_tp_getset, variant_getset},
    {0, nullptr},
};

PyType_Spec variant_spec = {"kt_kernel._core.Variant", sizeof(VariantObject), 0, Py_TPFLAGS_DEFAULT, variant_slots};

// Sets d[key] = value and drops the reference to value; false (error set) on failure.
bool put(PyObject* d, const char* key, PyObject* value) {
  if (value == nullptr) return false;
  const int rc = PyDict_SetItemString(d, key, value);
  Py_DECREF(value);
  return rc == 0;
}

PyObject* detect(PyObject*, PyObject*) {
  const kt::CpuInfo info = kt::detect_cpu();
  PyObject* features = PyDict_New();
  if (!features) return nullptr;
  for (const auto& kv : info.cpuid)
    if (!put(features, kv.first.c_str(), PyBool_FromLong(kv.second))) {
      Py_DECREF(features);
      return nullptr;
    }
  PyObject* d = PyDict_New();
  if (!d) {
    Py_DECREF(features);
    return nullptr;
  }
  const bool ok = put(d, "vendor", PyUnicode_FromString(info.vendor.c_str())) &&
                  put(d, "brand", PyUnicode_FromString(info.brand.c_str())) && put(d, "cpuid", features) &&
                  put(d, "osxsave", PyBool_FromLong(info.osxsave)) &&
                  put(d, "xcr0", PyLong_FromUnsignedLongLong(info.xcr0)) &&
                  put(d, "os_avx", PyBool_FromLong(info.os_avx)) &&
                  put(d, "os_avx512", PyBool_FromLong(info.os_avx512)) &&
                  put(d, "os_amx", PyBool_FromLong(info.os_amx));
  if (!ok) {
    Py_DECREF(d);
    return nullptr;
  }
  return d;
}

PyObject* amx_permission(PyObject*, PyObject*) { return PyLong_FromLong(kt::request_amx_permission()); }

PyMethodDef module_methods[] = {
    {"detect_cpu", detect, METH_NOARGS, "CPUID/XGETBV feature detection"},
    {"request_amx_permission", amx_permission, METH_NOARGS,
     "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA); returns 0 or an errno value"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_core", "kt_kernel baseline core: CPU detection and CPU-variant dispatch", -1,
    module_methods,        nullptr, nullptr,
    nullptr,               nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__core(void) {
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  PyObject* type = PyType_FromSpec(&variant_spec);
  // PyModule_AddObjectRef (3.10) never steals, so each failure path drops exactly its own references.
  const bool ok = type != nullptr && PyModule_AddObjectRef(m, "Variant", type) == 0 &&
                  PyModule_AddIntConstant(m, "CPU_ABI_VERSION", KT_CPU_ABI_VERSION) == 0;
  Py_XDECREF(type);
  if (!ok) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
