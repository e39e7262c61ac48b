// strata-flight: what went wrong in a failed or hung run, from its ranks'
// flight-recorder dumps (<output-dir>/flight/rank<R>.json; docs/debugging.md).
//
//   strata-flight runs/gpt            # the one-line diagnosis, each rank's last 5 collectives
//   strata-flight runs/gpt --last 20
#include "strata/recipes/app/flight_dumps.h"

int main(int argc, char** argv) { return strata::recipes::run_flight_report(argc, argv); }
