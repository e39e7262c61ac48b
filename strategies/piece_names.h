#pragma once
// The names checkpoint pieces carry (Strategy::state_pieces): "model/<param>"
// for a parameter's values, "optim/<param>/<key>" for its optimizer state.
#include <string>

namespace strata {

/// The parameter a state piece belongs to; "" for a piece of neither kind.
inline std::string param_of_piece(const std::string& piece) {
  if (piece.starts_with("model/")) return piece.substr(6);
  if (piece.starts_with("optim/")) return piece.substr(6, piece.rfind('/') - 6);
  return "";
}

}  // namespace strata
