# The API reference: Doxygen HTML of the public headers (the generated <ringgrad/...> tree of
# cmake/Package.cmake, so include this after it), into build/<preset>/docs/api/html.
#   cmake --build build/ci --target api-docs
# ctest docs.api_reference (label docs) builds it and fails on any Doxygen warning; it is skipped,
# with a message, where doxygen is not installed (scripts/setup-deps.sh installs it).
find_program(RG_DOXYGEN doxygen)
set(RG_API_DOCS_DIR ${PROJECT_BINARY_DIR}/docs/api)
configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in ${RG_API_DOCS_DIR}/Doxyfile @ONLY)
set(rg_run_doxygen ${CMAKE_COMMAND} -DDOXYGEN=${RG_DOXYGEN} -DDOXYFILE=${RG_API_DOCS_DIR}/Doxyfile
  -DOUT_DIR=${RG_API_DOCS_DIR} -P ${PROJECT_SOURCE_DIR}/cmake/RunDoxygen.cmake)
add_custom_target(api-docs
  COMMAND ${rg_run_doxygen}
  DEPENDS rg_public_headers
  COMMENT "Doxygen: the API reference in ${RG_API_DOCS_DIR}/html"
  VERBATIM)
if(RG_BUILD_TESTS)
  add_test(NAME docs.api_reference COMMAND ${rg_run_doxygen})
  # Without doxygen the test is skipped, not failed.
  set_tests_properties(docs.api_reference PROPERTIES LABELS docs TIMEOUT 300
    SKIP_REGULAR_EXPRESSION "doxygen not found")
endif()
