// tutti.Error and its subclasses: the one place a C++ Status becomes a Python exception.
//
//   StatusCode          Python class                 also a
//   INVALID_ARGUMENT    tutti.InvalidArgument        ValueError
//   OUT_OF_RANGE        tutti.OutOfRange             ValueError
//   NOT_FOUND           tutti.NotFound               LookupError
//   UNSUPPORTED         tutti.Unsupported            NotImplementedError
//   NOT_READY           tutti.NotReady               -
//   BUSY                tutti.Busy                   -
//   RESOURCE_EXHAUSTED  tutti.ResourceExhausted      -
//   TIMEOUT             tutti.TimeoutError           TimeoutError (the built-in)
//   DEVICE_ERROR        tutti.DeviceError            OSError
//   DATA_LOSS           tutti.DataLoss               -
//   INTERNAL            tutti.InternalError          -
//
// Every instance has `.code` (tutti.StatusCode) and `.message` (the C++ message: field, value, limit).
#include <nanobind/stl/string.h>

#include <cmath>

#include "ext.hpp"

namespace tutti::python {

namespace {

struct ErrorClass {
  StatusCode code;
  const char* name;
  PyObject* builtin;  // a second base, or nullptr
  const char* doc;
};

constexpr std::size_t kCodes = static_cast<std::size_t>(StatusCode::INTERNAL) + 1;
PyObject* g_classes[kCodes] = {};  // index: StatusCode; [0] is tutti.Error itself
PyObject* g_status_code_enum = nullptr;

}  // namespace

void define_errors(nb::module_& m) {
  const ErrorClass classes[] = {
      {StatusCode::INVALID_ARGUMENT, "InvalidArgument", PyExc_ValueError,
       "A field is malformed or violates a documented limit (INVALID_ARGUMENT); retrying cannot help."},
      {StatusCode::OUT_OF_RANGE, "OutOfRange", PyExc_ValueError,
       "An offset or length reaches past the end of a memory region or target (OUT_OF_RANGE)."},
      {StatusCode::NOT_FOUND, "NotFound", PyExc_LookupError,
       "A handle, file or block does not exist (NOT_FOUND), e.g. a closed target or an unregistered tensor."},
      {StatusCode::UNSUPPORTED, "Unsupported", PyExc_NotImplementedError,
       "A valid request this backend, build or file system cannot serve (UNSUPPORTED)."},
      {StatusCode::NOT_READY, "NotReady", nullptr, "The operation has not completed yet (NOT_READY)."},
      {StatusCode::BUSY, "Busy", nullptr,
       "The object is in use (BUSY): unregister or close while IO on it is in flight; try again later."},
      {StatusCode::RESOURCE_EXHAUSTED, "ResourceExhausted", nullptr,
       "Backpressure or a full budget (RESOURCE_EXHAUSTED): queue, slots, memory or disk space; resubmit later."},
      {StatusCode::TIMEOUT, "TimeoutError", PyExc_TimeoutError,
       "A time budget ran out (TIMEOUT). For Io.wait the IO stays in flight: wait again."},
      {StatusCode::DEVICE_ERROR, "DeviceError", PyExc_OSError,
       "The device or kernel reported an error (DEVICE_ERROR): an NVMe status or an errno."},
      {StatusCode::DATA_LOSS, "DataLoss", nullptr,
       "Bytes would be wrong or lost (DATA_LOSS): a short transfer, a hole, a block that failed its checksum."},
      {StatusCode::INTERNAL, "InternalError", nullptr, "A broken invariant inside Tutti (INTERNAL): a bug to report."},
  };
  PyObject* base = PyErr_NewExceptionWithDoc(
      "tutti.Error",
      "Base of every Tutti error. `code` is the tutti.StatusCode, `message` the C++ message (it names the field, "
      "the value and the limit).",
      PyExc_Exception, nullptr);
  if (base == nullptr) throw nb::python_error();
  g_classes[0] = base;
  m.attr("Error") = nb::borrow(base);
  for (const ErrorClass& c : classes) {
    PyObject* bases = c.builtin ? PyTuple_Pack(2, base, c.builtin) : PyTuple_Pack(1, base);
    const std::string qualified = std::string("tutti.") + c.name;
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), c.doc, bases, nullptr);
    Py_DECREF(bases);
    if (cls == nullptr) throw nb::python_error();
    g_classes[static_cast<std::size_t>(c.code)] = cls;  // kept for the life of the process
    m.attr(c.name) = nb::borrow(cls);
  }
  g_status_code_enum = m.attr("StatusCode").ptr();
  Py_INCREF(g_status_code_enum);
  m.def(
      "error_class",
      [](StatusCode code) -> nb::object {
        const auto index = static_cast<std::size_t>(code);
        if (index == 0 || index >= kCodes)
          raise_status(error(StatusCode::INVALID_ARGUMENT, "code = {} has no error class (OK is not an error)",
                             to_string(code)));
        return nb::borrow(g_classes[index]);
      },
      nb::arg("code"),
      "The tutti.Error subclass raised for a StatusCode (e.g. StatusCode.TIMEOUT -> tutti.TimeoutError).\n\n"
      "Raises tutti.InvalidArgument for StatusCode.OK.");
  m.def(
      "make_error",
      [](StatusCode code, const std::string& message) {
        if (code == StatusCode::OK)
          raise_status(error(StatusCode::INVALID_ARGUMENT, "make_error: code = OK is not an error"));
        return exception_for(Status(code, message));
      },
      nb::arg("code"), nb::arg("message"),
      "The tutti.Error subclass instance for (code, message), not raised: what the C++ layer raises for that "
      "Status (str() is 'CODE: message'; `.code`, `.message`).");
}

nb::object exception_for(const Status& status) {
  const auto index = static_cast<std::size_t>(status.code());
  PyObject* cls =
      index > 0 && index < kCodes ? g_classes[index] : g_classes[static_cast<std::size_t>(StatusCode::INTERNAL)];
  const std::string text = status.to_string();
  nb::str text_object(text.data(), text.size());
  nb::object exc = nb::steal(PyObject_CallOneArg(cls, text_object.ptr()));
  if (!exc.is_valid()) throw nb::python_error();
  nb::object code = nb::borrow(g_status_code_enum)(static_cast<int>(status.code()));
  nb::setattr(exc, "code", code);
  nb::setattr(exc, "message", nb::str(status.message().data(), status.message().size()));
  return exc;
}

void raise_status(const Status& status) {
  nb::object exc = exception_for(status);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw nb::python_error();
}

std::uint64_t seconds_to_ns(double seconds, std::string_view field) {
  if (std::isnan(seconds) || seconds < 0)
    raise_status(error(StatusCode::INVALID_ARGUMENT, "{} = {} s must be >= 0 seconds", field, seconds));
  const double ns = seconds * 1e9;
  if (!(ns < static_cast<double>(kMaxBudgetNs))) return kMaxBudgetNs;
  return static_cast<std::uint64_t>(ns);
}

}  // namespace tutti::python
