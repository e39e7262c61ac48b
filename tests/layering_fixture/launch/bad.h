#pragma once
// Layering fixture: a project include without the strata/ prefix resolves in
// no install (include/strata/core/...), so the check refuses it.
#include "core/device.h"
