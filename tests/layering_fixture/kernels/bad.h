#pragma once
// Layering fixture: kernels/ may include core/ only; this include points up.
#include "strategies/strategy.h"
