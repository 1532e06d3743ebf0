// Freeing a nlohmann-json value without allocating.
//
// basic_json's destructor allocates: to free an array's or an object's
// children without recursion it moves them into a std::vector first
// (json_value::destroy), and the std::bad_alloc of that vector, thrown in a
// noexcept destructor, ends the process with std::terminate. (nlohmann/json
// #4653 and #5135, open upstream; 3.11.2 as Debian 12 ships it.) Where the
// system refuses memory, any JSON document ckptio parses or builds would
// then end the process as it goes out of scope.
//
// free_json takes a value apart leaf first: each child is freed before it
// is removed from its parent, so no destructor finds children to move, and
// nothing allocates (std::map's erase, and nlohmann's ordered_map erasing its
// last element, allocate nothing). It walks down without recursion, keeping
// the last 64 ancestors at hand (a deeper document is walked again from the
// root), so a hostile nesting depth costs time, not the stack. JsonFreer
// does it as a scope ends, an exception's unwinding included, and
// parse_json_into parses into a value the caller holds, so that a parse the
// system refuses memory midway leaves its partial document there, to be
// freed the same way (J::parse would free it as it unwinds, allocating).
//
// One more trap of 3.11.2: turning a null into an object or an array
// (operator[] with a key, push_back) sets the type before it allocates the
// container, and the value a refused allocation leaves behind crashes
// whoever destroys it. Make containers whole (J::object(), J::array()) before
// filling them, as serialize_zarray does.
#pragma once

#include <cstring>
#include <iterator>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ckptio {
namespace json_free_internal {

// (get_ptr, not is_array() and get_ref: a value whose container the system
// refused as it was being made says it is one and holds a null pointer.)
template <class J>
bool has_children(J& j) noexcept {
  if (auto* a = j.template get_ptr<typename J::array_t*>()) return !a->empty();
  if (auto* o = j.template get_ptr<typename J::object_t*>()) return !o->empty();
  return false;
}
// Of a value has_children() is true of:
template <class J>
J& last_child(J& j) noexcept {
  if (auto* a = j.template get_ptr<typename J::array_t*>()) return a->back();
  return std::prev(j.template get_ptr<typename J::object_t*>()->end())->second;
}
template <class J>
void remove_last_child(J& j) noexcept {
  if (auto* a = j.template get_ptr<typename J::array_t*>()) {
    a->pop_back();
  } else {
    auto* o = j.template get_ptr<typename J::object_t*>();
    o->erase(std::prev(o->end()));
  }
}

}  // namespace json_free_internal

template <class J>
void free_json(J& root) noexcept {
  using namespace json_free_internal;
  constexpr int kPath = 64;
  J* path[kPath];
  int n = 0;  // ancestors of `cur` at hand, nearest last
  J* cur = &root;
  for (;;) {
    if (!has_children(*cur)) {
      if (cur == &root) return;
      cur = n > 0 ? path[--n] : &root;  // (past the ones at hand: from the root again)
      continue;
    }
    J& last = last_child(*cur);
    if (!has_children(last)) {
      remove_last_child(*cur);  // a leaf, or empty: its destructor allocates nothing
      continue;
    }
    if (n == kPath) {
      std::memmove(path, path + 1, sizeof(J*) * (kPath - 1));
      --n;
    }
    path[n++] = cur;
    cur = &last;
  }
}

// free_json(j) when the scope ends: declared right after `j`.
template <class J>
class JsonFreer {
 public:
  explicit JsonFreer(J& j) : j_(j) {}
  ~JsonFreer() { free_json(j_); }
  JsonFreer(const JsonFreer&) = delete;
  JsonFreer& operator=(const JsonFreer&) = delete;

 private:
  J& j_;
};

namespace json_free_internal {

// What the parser reports goes out as J::parse_error, the one exception
// callers catch for text that is not JSON: nlohmann's parser also reports a
// number too large for a double ("1e999") as out_of_range (406), which
// nlohmann::json::parse(text, nullptr, false) turned into a discarded value.
template <class J, class Exception>
[[noreturn]] void throw_as_parse_error(std::size_t at, const Exception& e) {
  if constexpr (std::is_same_v<Exception, typename J::parse_error>) {
    throw e;
  } else {
    throw J::parse_error::create(101, at, e.what(), nullptr);
  }
}

// Counts the members of each object, in the order the objects open.
template <class J>
struct MemberCounts {
  std::vector<size_t> counts;
  std::vector<size_t> open;  // positions in counts of the objects open (arrays: npos)
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(typename J::number_integer_t) { return true; }
  bool number_unsigned(typename J::number_unsigned_t) { return true; }
  bool number_float(typename J::number_float_t, const typename J::string_t&) { return true; }
  bool string(typename J::string_t&) { return true; }
  bool binary(typename J::binary_t&) { return true; }
  bool start_object(std::size_t) {
    open.push_back(counts.size());
    counts.push_back(0);
    return true;
  }
  bool key(typename J::string_t&) {
    ++counts[open.back()];
    return true;
  }
  bool end_object() {
    open.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    open.push_back(static_cast<size_t>(-1));
    return true;
  }
  bool end_array() {
    open.pop_back();
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t at, const std::string&, const Exception& e) {
    throw_as_parse_error<J>(at, e);
  }
};

// nlohmann's DOM parser, but each object's room made for all its members
// as it opens (`counts`, from a first pass): an ordered_json object, a
// vector of pairs with const keys, then never grows by copying its members
// and freeing the old copies (which allocates: see above).
template <class J>
class ReservingDom {
 public:
  ReservingDom(J& root, const std::vector<size_t>& counts) : root_(root), counts_(counts) {}
  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(typename J::number_integer_t v) { return put(v); }
  bool number_unsigned(typename J::number_unsigned_t v) { return put(v); }
  bool number_float(typename J::number_float_t v, const typename J::string_t&) { return put(v); }
  bool string(typename J::string_t& v) { return put(std::move(v)); }
  bool binary(typename J::binary_t& v) { return put(J::binary(std::move(v))); }
  bool start_object(std::size_t) {
    put(J::value_t::object);
    auto* o = last_->template get_ptr<typename J::object_t*>();
    if constexpr (requires { o->reserve(size_t{}); }) o->reserve(counts_.at(objects_));
    ++objects_;
    open_.push_back(last_);
    return true;
  }
  bool key(typename J::string_t& k) {
    member_ = &(*open_.back()->template get_ptr<typename J::object_t*>())[k];
    return true;
  }
  bool end_object() {
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    put(J::value_t::array);
    open_.push_back(last_);
    return true;
  }
  bool end_array() {
    open_.pop_back();
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t at, const std::string&, const Exception& e) {
    throw_as_parse_error<J>(at, e);
  }

 private:
  template <class V>
  bool put(V&& v) {
    if (open_.empty()) {
      root_ = J(std::forward<V>(v));
      last_ = &root_;
    } else if (auto* a = open_.back()->template get_ptr<typename J::array_t*>()) {
      a->emplace_back(std::forward<V>(v));  // (moves, never copies, the elements before)
      last_ = &a->back();
    } else {
      *member_ = J(std::forward<V>(v));
      last_ = member_;
    }
    return true;
  }
  J& root_;
  const std::vector<size_t>& counts_;
  size_t objects_ = 0;
  std::vector<J*> open_;
  J* member_ = nullptr;
  J* last_ = nullptr;
};

}  // namespace json_free_internal

// J::parse(text) into `root`, which a JsonFreer declared with it frees (also
// when this throws: J::parse_error for bad JSON, std::bad_alloc). Two passes
// over the text: the members of each object are counted first, so that the
// objects of an ordered_json never grow by copying.
template <class J>
void parse_json_into(J& root, std::string_view text) {
  json_free_internal::MemberCounts<J> counts;
  J::sax_parse(text.begin(), text.end(), &counts);
  json_free_internal::ReservingDom<J> dom(root, counts.counts);
  J::sax_parse(text.begin(), text.end(), &dom);
}

}  // namespace ckptio
