// rg::Error, the type of every library error (rg::InternalError, derived from it, for ringgrad's
// own bugs), under the engine's include path so users catch it without a kernels/ header. Defined
// in kernels/error.h, the bottom layer, so that every layer throws the same type.
#pragma once

#include "kernels/error.h"  // IWYU pragma: export
