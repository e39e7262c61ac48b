#pragma once
// Layering fixture: kernels/ may include core/ only; this include points up.
#include "strata/strategies/strategy.h"
