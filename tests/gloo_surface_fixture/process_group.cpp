// A process_group.cpp that does what strata's must not: it compiles in an
// inline function of Gloo's own headers. check_gloo_surface.cmake must fail
// on its object (ctest gloo_surface_detects_inline_gloo).
#include <gloo/common/string.h>

#include <string>

namespace c10d {
struct ProcessGroupGloo {
  ProcessGroupGloo();
};
}  // namespace c10d

std::string gloo_fixture() {
  c10d::ProcessGroupGloo group;
  return gloo::MakeString("rank ", 1);
}
