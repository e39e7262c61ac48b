// Fixture for the layering_detects_recipe_part_above test: a model header
// that includes the app (a higher part of recipes/). Never compiled.
#pragma once
#include "strata/recipes/app/run.h"
