// The one source of libringgrad.so (cmake/Package.cmake); the rest comes from the static libraries.
#include "ringgrad/version.h"

extern "C" const char* ringgrad_version() { return RINGGRAD_VERSION; }
