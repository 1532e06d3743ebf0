// The S3 backend's HTTP client (backends/s3/http_client.h) on its own, with no
// server: what its destructor does to requests still queued.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "backends/s3/http_client.h"

namespace ckptio::s3 {
namespace {

using namespace std::chrono_literals;

// Every request still queued when the client is destroyed fails, with
// CURLE_ABORTED_BY_CALLBACK, and its callback runs: the ones the loop took
// from its queue in the very turn it saw the client stopping too (before,
// those were dropped without a callback, and whoever waited on one, hung).
TEST(HttpClient, DestroyingTheClientFailsEveryQueuedRequest) {
  auto client = std::make_unique<HttpClient>(HttpClientOptions{});
  // The first request holds the loop inside its prepare hook (on the loop
  // thread) while the next ones queue behind it.
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  HttpRequest first;
  first.method = "GET";
  first.url = "http://127.0.0.1:1/held";  // (nothing listens on port 1)
  first.prepare = [&entered, released](HttpRequest&) {
    entered.set_value();
    released.wait();
  };
  std::promise<HttpResponse> first_done;
  client->submit(std::move(first), [&](HttpResponse r) { first_done.set_value(std::move(r)); });
  entered.get_future().wait();

  constexpr int kQueued = 5;
  std::promise<HttpResponse> done[kQueued];
  for (int i = 0; i < kQueued; ++i) {
    HttpRequest r;
    r.method = "GET";
    r.url = "http://127.0.0.1:1/queued";
    client->submit(std::move(r), [&done, i](HttpResponse resp) { done[i].set_value(std::move(resp)); });
  }
  // The destructor marks the client stopping, then joins the loop, which is
  // still held: let it go once the mark is surely set.
  std::thread destroyer([&] { client.reset(); });
  std::this_thread::sleep_for(200ms);
  release.set_value();
  destroyer.join();

  for (int i = 0; i < kQueued; ++i) {
    auto f = done[i].get_future();
    ASSERT_EQ(f.wait_for(0s), std::future_status::ready) << "request " << i << "'s callback never ran";
    const HttpResponse r = f.get();
    EXPECT_NE(r.curl_code, 0) << "request " << i;
  }
  auto f = first_done.get_future();
  ASSERT_EQ(f.wait_for(0s), std::future_status::ready);
  EXPECT_NE(f.get().curl_code, 0);
}

}  // namespace
}  // namespace ckptio::s3
