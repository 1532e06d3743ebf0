#include "ckptio/status.h"

#include <cerrno>
#include <cstring>

namespace ckptio {

const char* code_name(Code c) {
  switch (c) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kNotFound: return "NotFound";
    case Code::kAlreadyExists: return "AlreadyExists";
    case Code::kFailedPrecondition: return "FailedPrecondition";
    case Code::kPermissionDenied: return "PermissionDenied";
    case Code::kNoSpace: return "NoSpace";
    case Code::kIOError: return "IOError";
    case Code::kUnavailable: return "Unavailable";
    case Code::kDataLoss: return "DataLoss";
    case Code::kUnimplemented: return "Unimplemented";
    case Code::kCancelled: return "Cancelled";
    case Code::kInternal: return "Internal";
    case Code::kResourceExhausted: return "ResourceExhausted";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(code_name(code_)) + ": " + msg_;
}

Status Status::annotate(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + msg_);
}

Status Status::from_errno(int err, const std::string& what) {
  Code c = Code::kIOError;
  switch (err) {
    case ENOENT: c = Code::kNotFound; break;
    case EEXIST: case ENOTEMPTY: c = Code::kAlreadyExists; break;
    case EACCES: case EPERM: case EROFS: c = Code::kPermissionDenied; break;
    case ENOSPC: case EDQUOT: c = Code::kNoSpace; break;
    case EINVAL: case ENAMETOOLONG: case ENOTDIR: case EISDIR: c = Code::kInvalidArgument; break;
    case EAGAIN: case EINTR: case ETIMEDOUT: c = Code::kUnavailable; break;
    case ENOSYS: case EOPNOTSUPP: c = Code::kUnimplemented; break;
    case ENOMEM: c = Code::kResourceExhausted; break;  // the kernel's memory (io_uring rings, locked pages)
    default: c = Code::kIOError; break;
  }
  return Status(c, what + ": " + std::strerror(err));
}

}  // namespace ckptio
