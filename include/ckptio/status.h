// Status and Result<T>: errors are values in ckptio. No exception crosses the
// public API or the storage seam, but one: std::bad_alloc may leave a
// backend's call (storage.h says what a write then did), and the core turns
// it into kResourceExhausted (docs/reliability.md, "Out of memory").
//
// A Status carries a code and a human-readable message. Two properties matter
// to callers beyond the code:
//   - retryable(): the operation may succeed if repeated unchanged (a transient
//     network or server fault). The one retry predicate lives here.
//   - data_loss(): stored bytes are damaged (checksum mismatch, truncated file,
//     an index that fails to parse). Never retried.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace ckptio {

enum class Code : uint8_t {
  kOk = 0,
  kInvalidArgument,    // the caller asked for something malformed
  kNotFound,           // a key, step or leaf that does not exist
  kAlreadyExists,      // e.g. saving a committed step without overwrite
  kFailedPrecondition, // state does not allow the operation (e.g. closed)
  kPermissionDenied,   // EACCES / EPERM / EROFS, 403
  kNoSpace,            // ENOSPC / EDQUOT
  kIOError,            // EIO and other I/O failures
  kUnavailable,        // transient: retryable by definition
  kDataLoss,           // corruption: checksum mismatch, bad index, truncation
  kUnimplemented,      // the backend or build lacks the feature
  kCancelled,          // aborted by the caller or by shutdown
  kInternal,           // a bug in ckptio
  kResourceExhausted,  // out of memory (or another limit of the process): the
                       // operation left nothing behind and may succeed later
};
inline constexpr Code kLastCode = Code::kResourceExhausted;

const char* code_name(Code c);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message) : code_(code), msg_(std::move(message)) {}

  static Status OK() { return Status(); }
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  bool retryable() const { return code_ == Code::kUnavailable; }
  bool data_loss() const { return code_ == Code::kDataLoss; }

  // "NotFound: step 12 has no index" style text for logs and CLI output.
  std::string to_string() const;

  // Returns a copy whose message is "context: message"; code is kept.
  Status annotate(const std::string& context) const;

  // Maps an errno value from a failed system call to a Status naming `what`.
  static Status from_errno(int err, const std::string& what);

 private:
  Code code_ = Code::kOk;
  std::string msg_;
};

inline Status invalid_argument(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
inline Status not_found(std::string m) { return Status(Code::kNotFound, std::move(m)); }
inline Status data_loss(std::string m) { return Status(Code::kDataLoss, std::move(m)); }
inline Status io_error(std::string m) { return Status(Code::kIOError, std::move(m)); }
inline Status internal_error(std::string m) { return Status(Code::kInternal, std::move(m)); }
// "out of memory: <what>": an allocation for `what` failed.
inline Status out_of_memory(const std::string& what) {
  return Status(Code::kResourceExhausted, "out of memory: " + what);
}

// Result<T>: either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                 // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}          // NOLINT: must not be OK
  bool ok() const { return v_.index() == 0; }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<1>(v_);
  }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ckptio

#define CKPTIO_CONCAT_INNER(a, b) a##b
#define CKPTIO_CONCAT(a, b) CKPTIO_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define CKPTIO_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::ckptio::Status _st = (expr);            \
    if (!_st.ok()) return _st;                \
  } while (0)

// Declares `lhs` from a Result<T> expression or returns its error.
#define CKPTIO_ASSIGN_OR_RETURN(lhs, expr)                                   \
  auto CKPTIO_CONCAT(_res_, __LINE__) = (expr);                               \
  if (!CKPTIO_CONCAT(_res_, __LINE__).ok())                                   \
    return CKPTIO_CONCAT(_res_, __LINE__).status();                           \
  lhs = std::move(CKPTIO_CONCAT(_res_, __LINE__)).value()
