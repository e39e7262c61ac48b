#pragma once
// what_of(): the one-line message a callable throws ("<no exception>" if none),
// for tests that check error texts.
#include <c10/util/Exception.h>

#include <exception>
#include <functional>
#include <string>

namespace strata::testing {

inline std::string what_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

}  // namespace strata::testing

/// EXPECT that `haystack` (a string) contains `needle`, printing it if not.
#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "in: " << (haystack)
