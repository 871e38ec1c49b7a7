// The process-wide default generator and manual_seed.
#include "engine/generator.h"

namespace rg {

Generator& default_generator() {
  static Generator gen(67280421310721ULL);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().set_state(seed, 0); }

}  // namespace rg
