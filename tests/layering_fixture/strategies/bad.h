// Fixture for the layering_detects_upward_include test: a strategy header
// that includes the trainer (a higher layer). Never compiled.
#pragma once
#include "strata/core/training_module.h"
#include "strata/trainer/trainer.h"
