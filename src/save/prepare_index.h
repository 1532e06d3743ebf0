// A single-process save's index, prepared while its data is written.
#pragma once

#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include "ckptio/status.h"
#include "ckptio/storage.h"
#include "src/save/save_job.h"

namespace ckptio {

// A single-process save prepares its index on a thread of its own while
// the data is written: the records at once, the checksums once every write
// is queued (and every checksum known), then the text, while the last
// writes drain and the files are made durable. The text is then written to
// the stage directory (POSIX; there no reader sees it before the rename)
// while it is read back (the index we write must be one we can read back:
// never commit a step that discovery would reject), both usually before
// the data has drained (README "Many small leaves" measures what that
// saves at 100,000 leaves). Nothing is published unless the writes
// succeed and the text reads back (the caller publishes json() once
// verdict() is OK: publish_attempt).
//
// `job` and `crcs` must outlive this object; `crcs` is read only once
// checksums_known(true) was called. The destructor waits for the thread.
class IndexPreparer {
 public:
  IndexPreparer(Storage& storage, const SaveJob& job, const std::vector<uint32_t>& crcs);
  ~IndexPreparer();
  IndexPreparer(const IndexPreparer&) = delete;
  IndexPreparer& operator=(const IndexPreparer&) = delete;

  // Every checksum is known (true), or the writes failed (false: the index
  // is given up). The first call counts; later ones do nothing.
  void checksums_known(bool ok);
  // Once checksums_known() was called: OK when the index is staged and
  // reads back. Prepared on this thread if no thread could be had.
  Status verdict();
  // The index's text, once verdict() is OK.
  const std::string& json() const { return json_; }

 private:
  void prepare();

  Storage& storage_;
  const SaveJob& job_;
  const std::vector<uint32_t>& crcs_;
  std::string json_;     // written by the thread before it says its verdict
  bool told_ = false;    // the worker's only: checksums_known() was called
  std::promise<bool> checksums_known_;  // false: the writes failed, give up
  std::future<bool> known_ = checksums_known_.get_future();
  // The verdict (index staged and read back) comes before the two indexes
  // are freed (at 100,000 leaves ~20 ms of free() calls): they are freed off
  // the commit's path, while it publishes.
  std::promise<Status> verdict_promise_;
  std::future<Status> verdict_ = verdict_promise_.get_future();
  // Invalid when no thread could be had: the index is then prepared on the
  // worker once the writes are done. (Last: its destructor waits for the
  // thread before anything it uses is destroyed.)
  std::future<void> prepared_;
};

}  // namespace ckptio
